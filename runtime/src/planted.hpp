// Planted mistakes (internal, for tests): switches that each remove one
// ordering, or break one CUDA rule, in a copy path, so that tests can
// prove the simulation's checker reports it on every run. All are off
// unless a test turns them on; each costs a relaxed atomic load where it
// is read.
#pragma once

namespace dlasync::detail {

enum class planted : unsigned {
  // copy_on_gpu: the import's stream does not wait for the producer's.
  skip_producer_wait = 1u << 0,
  // Upload: the staging streams do not wait for the import's stream, on
  // which the destination was allocated.
  skip_staging_start_wait = 1u << 1,
  // Upload: a staging chunk goes back to the pool as soon as its copy is
  // enqueued, not when its event completes.
  early_chunk_return = 1u << 2,
  // Download: the host copies a chunk out as soon as its copy is enqueued.
  early_chunk_read = 1u << 3,
  // A failed or cancelled pipeline reports without draining its streams.
  skip_failure_drain = 1u << 4,
  // Strided peer copy: the temporary is freed without waiting for the
  // copy that reads it.
  early_temporary_free = 1u << 5,
  // order_after records an event of the waiting stream's device.
  event_of_waiter_device = 1u << 6,
  // The gather kernel is launched without making its device current.
  launch_off_device = 1u << 7,
};

// Whether `m` is planted now.
bool planted_mistake(planted m) noexcept;
// Plants exactly the mistakes in `mask` (a set of `planted` bits; 0 for
// none).
void plant_mistakes(unsigned mask) noexcept;

}  // namespace dlasync::detail
