// dlasync/dlasync.hpp
//
// The umbrella header: everything a user of dlasync needs.
#pragma once

#include "dlasync/runtime/device.hpp"
#include "dlasync/runtime/device_buffer.hpp"
#include "dlasync/runtime/device_registry.hpp"
#include "dlasync/runtime/dlpack_stream.hpp"
#include "dlasync/runtime/gpu_stream.hpp"
#include "dlasync/runtime/memory_budget.hpp"
#include "dlasync/runtime/runtime.hpp"
#include "dlasync/runtime/runtime_options.hpp"
#include "dlasync/runtime/runtime_stats.hpp"
#include "dlasync/runtime/topology.hpp"
#include "dlasync/transfer/dlpack.hpp"
#include "dlasync/transfer/dtype.hpp"
#include "dlasync/transfer/import.hpp"
#include "dlasync/transfer/import_error.hpp"
#include "dlasync/transfer/import_options.hpp"
#include "dlasync/transfer/limits.hpp"
#include "dlasync/transfer/managed_tensor.hpp"
#include "dlasync/transfer/producer.hpp"
#include "dlasync/transfer/tensor.hpp"
#include "dlasync/transfer/validate.hpp"
