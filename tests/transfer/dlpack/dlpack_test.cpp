#include "dlasync/dlpack.hpp"

#include "catch2/catch.hpp"

namespace dlasync {

TEST_CASE("device types newer than the header convert without loss", "[transfer][dlpack]") {
  for (std::int32_t code : {1, 2, 3, 13, 17, 18, 19, 20, 42, -7, 1 << 30}) {
    const DLDevice dl = to_dl_device({static_cast<device_kind>(code), 3});
    CHECK(device_type_code(dl) == code);
    CHECK(dl.device_id == 3);
    CHECK(static_cast<std::int32_t>(device_from_dl(dl).kind) == code);
  }
}

TEST_CASE("the declared 1.x flags have DLPack's values", "[transfer][dlpack]") {
  CHECK(flag_read_only == 1);
  CHECK(flag_is_copied == 2);
  CHECK(flag_subbyte_padded == 4);
  CHECK(dlpack_major_version == 1);
}

TEST_CASE("the 1.x types are declared exactly when the included dlpack.h is older",
          "[transfer][dlpack]") {
#if defined(DLASYNC_DECLARES_DLPACK_V1)
  // Debian's dlpack.h 0.6: dlasync declares DLManagedTensorVersioned.
  CHECK(DLPACK_VERSION < 100);
#else
  CHECK(DLPACK_MAJOR_VERSION >= 1);
#endif
  // Whoever declared it, a versioned tensor reads back through the handle
  // at DLPack's offsets.
  DLManagedTensorVersioned m{};
  m.version = {1, 3};
  m.flags = flag_read_only | flag_is_copied;
  m.dl_tensor.ndim = 2;
  managed_tensor t(&m);
  CHECK(t.version().major == 1);
  CHECK(t.version().minor == 3);
  CHECK(t.flags() == (flag_read_only | flag_is_copied));
  CHECK(t.dl_tensor()->ndim == 2);
  (void)t.release();
}

}  // namespace dlasync
