// dlasync/dlasync.hpp
//
// The umbrella header: everything a user of dlasync needs.
#pragma once

#include "dlasync/device.hpp"
#include "dlasync/device_buffer.hpp"
#include "dlasync/device_registry.hpp"
#include "dlasync/dlpack.hpp"
#include "dlasync/dlpack_stream.hpp"
#include "dlasync/dtype.hpp"
#include "dlasync/gpu_stream.hpp"
#include "dlasync/import.hpp"
#include "dlasync/import_options.hpp"
#include "dlasync/limits.hpp"
#include "dlasync/memory_budget.hpp"
#include "dlasync/producer.hpp"
#include "dlasync/runtime.hpp"
#include "dlasync/tensor.hpp"
#include "dlasync/validate.hpp"
