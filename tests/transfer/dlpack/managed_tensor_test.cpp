#include "dlasync/dlpack.hpp"

#include "catch2/catch.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {
namespace {

using testing::deleter_count;
using testing::make_tensor;
using testing::tensor_spec;

float buffer[16];

tensor_spec small(bool versioned) {
  tensor_spec s;
  s.shape = {4, 4};
  s.data = buffer;
  s.versioned = versioned;
  return s;
}

}  // namespace

TEST_CASE("a managed tensor calls its deleter once when destroyed", "[transfer][managed]") {
  for (bool versioned : {false, true}) {
    deleter_count count;
    {
      managed_tensor t = make_tensor(small(versioned), count);
      CHECK(t.is_versioned() == versioned);
      CHECK(count.calls == 0);
    }
    CHECK(count.calls == 1);
  }
}

TEST_CASE("moving a managed tensor moves the duty to delete", "[transfer][managed]") {
  deleter_count count;
  managed_tensor a = make_tensor(small(true), count);
  managed_tensor b = std::move(a);
  CHECK(a.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is the point
  CHECK_FALSE(b.empty());
  {
    managed_tensor c(std::move(b));
    CHECK(count.calls == 0);
  }
  CHECK(count.calls == 1);
}

TEST_CASE("move-assigning over a held tensor deletes the old one once", "[transfer][managed]") {
  deleter_count first;
  deleter_count second;
  managed_tensor a = make_tensor(small(false), first);
  a = make_tensor(small(true), second);
  CHECK(first.calls == 1);
  CHECK(second.calls == 0);
  a.reset();
  CHECK(second.calls == 1);
  a.reset();
  CHECK(second.calls == 1);
}

TEST_CASE("release gives the pointer back without deleting", "[transfer][managed]") {
  deleter_count count;
  managed_tensor t = make_tensor(small(true), count);
  DLManagedTensorVersioned* raw = t.versioned();
  released_tensor r = t.release();
  CHECK(t.empty());
  CHECK(r.versioned == raw);
  CHECK(r.legacy == nullptr);
  CHECK(count.calls == 0);
  managed_tensor again(r);  // and it can be owned again
  CHECK(again.versioned() == raw);
  again.reset();
  CHECK(count.calls == 1);
}

TEST_CASE("a NULL deleter is legal", "[transfer][managed]") {
  DLManagedTensor legacy{};
  DLManagedTensorVersioned versioned{};
  versioned.version = {1, 0};
  managed_tensor a(&legacy);
  managed_tensor b(&versioned);
  a.reset();
  b.reset();
  CHECK(a.empty());
  CHECK(b.empty());
}

TEST_CASE("a newer major version exposes only its version and deleter", "[transfer][managed]") {
  deleter_count count;
  tensor_spec s = small(true);
  s.version = {2, 0};
  {
    managed_tensor t = make_tensor(s, count);
    CHECK_FALSE(t.version_supported());
    CHECK(t.dl_tensor() == nullptr);
    CHECK(t.flags() == 0);
    CHECK(t.version().major == 2);
  }
  CHECK(count.calls == 1);
}

TEST_CASE("legacy tensors report version 0.0 and no flags", "[transfer][managed]") {
  deleter_count count;
  managed_tensor t = make_tensor(small(false), count);
  CHECK(t.version().major == 0);
  CHECK(t.flags() == 0);
  CHECK(t.version_supported());
  REQUIRE(t.dl_tensor() != nullptr);
  CHECK(t.dl_tensor()->ndim == 2);
}

}  // namespace dlasync
