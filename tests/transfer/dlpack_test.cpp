#include "dlasync/transfer/dlpack.hpp"

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
#if defined(DLASYNC_DECLARES_DLPACK_V1)
  SUCCEED("dlasync declared the DLPack 1.x types (the included dlpack.h is older)");
#endif
}

}  // namespace dlasync
