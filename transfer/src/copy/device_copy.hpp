// GPU copies (internal): the paths whose work runs on CUDA streams.
//   copy_on_gpu               pinned_to_gpu, within_gpu and gpu_to_gpu: one
//                             cudaMemcpyAsync, the gather kernel, or a
//                             compaction on the source GPU then a copy across;
//   upload_through_staging    pageable_to_gpu: the staging pipeline;
//   download_through_staging  gpu_to_host: a compaction on the GPU when
//                             strided, then the pipeline back.
// Each first orders its stream after the producer's, on the device.
#pragma once

#include "runtime/src/backend.hpp"
#include "runtime/src/completion_marker.hpp"
#include "transfer/src/copy/copy_services.hpp"
#include "transfer/src/copy/transfer_path.hpp"

namespace dlasync::detail {

// Each needs `with.cuda` and, through the staging pipeline, `with.workers`.
marker_ptr copy_on_gpu(const copy_services& with, stream_slot s, const copy_request& request);
marker_ptr upload_through_staging(const copy_services& with, stream_slot s,
                                  const copy_request& request);
marker_ptr download_through_staging(const copy_services& with, stream_slot s, copy_request request);

}  // namespace dlasync::detail
