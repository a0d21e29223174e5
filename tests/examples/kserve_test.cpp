#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "asio/co_spawn.hpp"
#include "asio/use_future.hpp"
#include "buffer_pool.hpp"
#include "catch2/catch.hpp"
#include "host_models.hpp"
#include "http_parse.hpp"
#include "kserve.hpp"
#include "kserve_grpc.hpp"
#include "kserve_json.hpp"
#include "kserve_models.hpp"
#include "kserve_requests.hpp"
#include "kserve_service.hpp"
#include "shm_registry.hpp"
#include "support/test_tensors.hpp"
#include "ucx_protocol.hpp"

namespace dlasync::examples::kserve {
namespace {

using dlasync::testing::require_status;

// A body of `json` followed by `binary`, as the binary extension sends it.
request_body body_of(const std::string& json, const std::string& binary = "",
                     bool with_header_length = false) {
  request_body b;
  b.length = json.size() + binary.size();
  b.bytes = std::shared_ptr<std::byte[]>(new std::byte[std::max<std::size_t>(b.length, 1)]);
  std::memcpy(b.bytes.get(), json.data(), json.size());
  std::memcpy(b.bytes.get() + json.size(), binary.data(), binary.size());
  if (with_header_length) b.header_length = json.size();
  return b;
}

std::string floats_bytes(std::initializer_list<float> v) {
  std::string s(v.size() * sizeof(float), '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

TEST_CASE("every fixed-size datatype of the protocol maps to a dtype and back",
          "[examples][kserve]") {
  for (const char* name : {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                           "INT64", "FP16", "FP32", "FP64", "BF16"}) {
    INFO(name);
    absl::StatusOr<dtype> t = dtype_of(name);
    REQUIRE(t.ok());
    CHECK(datatype_of(*t) == absl::string_view(name));
  }
  CHECK(*dtype_of("BF16") == dtypes::bfloat16);
  CHECK(*dtype_of("BOOL") == dtypes::bool8);
  require_status(dtype_of("BYTES").status(), absl::StatusCode::kInvalidArgument,
                 {"BYTES", "no fixed size"});
  require_status(dtype_of("FP8").status(), absl::StatusCode::kInvalidArgument, {"\"FP8\"", "FP32"});
  CHECK_FALSE(datatype_of(dtypes::complex64).has_value());
}

TEST_CASE("sizes overflow into an error, not a wrapped count", "[examples][kserve]") {
  const std::vector<std::int64_t> huge{std::int64_t{1} << 40, std::int64_t{1} << 30};
  CHECK_FALSE(byte_size(dtypes::float32, huge).has_value());
  const std::vector<std::int64_t> fine{3, 5};
  CHECK(byte_size(dtypes::float64, fine) == 120);
}

TEST_CASE("JSON data becomes the input's bytes, nested or flat", "[examples][kserve]") {
  memory_budget budget(1 << 20);
  {
    absl::StatusOr<infer_request> r = parse_infer_request(
        body_of(R"({"id":"7","inputs":[{"name":"INPUT0","shape":[2,2],"datatype":"FP32",)"
                R"("data":[[1,2.5],[3,-4]]},{"name":"B","shape":[3],"datatype":"BOOL",)"
                R"("data":[true,false,true]}],"outputs":[{"name":"O","parameters":)"
                R"({"binary_data":true}}]})"),
        "sum", "", budget);
    REQUIRE(r.ok());
    CHECK(r->id == "7");
    CHECK(r->model == "sum");
    REQUIRE(r->inputs.size() == 2);
    const input_tensor& in = r->inputs[0];
    CHECK(in.type == dtypes::float32);
    CHECK(in.bytes == 16);
    float v[4];
    std::memcpy(v, in.data, sizeof v);
    CHECK(v[0] == 1.0F);
    CHECK(v[1] == 2.5F);
    CHECK(v[3] == -4.0F);
    CHECK(static_cast<int>(r->inputs[1].data[1]) == 0);
    CHECK(static_cast<int>(r->inputs[1].data[2]) == 1);
    REQUIRE(r->outputs.size() == 1);
    CHECK(r->outputs[0].binary == true);
    CHECK(budget.in_use() == 19);  // the converted buffers, held by the inputs
  }
  CHECK(budget.in_use() == 0);
}

TEST_CASE("binary data is located in the body, never copied", "[examples][kserve]") {
  memory_budget budget(1 << 20);
  const std::string json = R"({"inputs":[{"name":"INPUT0","shape":[2],"datatype":"FP32",)"
                           R"("parameters":{"binary_data_size":8}}]})";
  request_body body = body_of(json, floats_bytes({1.5F, 2.5F}), true);
  absl::StatusOr<infer_request> r = parse_infer_request(body, "sum", "1", budget);
  REQUIRE(r.ok());
  CHECK(r->inputs[0].data == body.bytes.get() + json.size());
  CHECK(r->version == "1");
  CHECK(budget.in_use() == 0);
}

TEST_CASE("malformed requests are refused by name", "[examples][kserve]") {
  memory_budget budget(1 << 20);
  const auto refused = [&](const request_body& b, std::initializer_list<const char*> words,
                           absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
    absl::StatusOr<infer_request> r = parse_infer_request(b, "sum", "", budget);
    require_status(r.status(), code, words);
  };
  SECTION("not JSON") {
    refused(body_of("{\"inputs\":["), {"not JSON"});
  }
  SECTION("wrong types") {
    refused(body_of(R"({"inputs":{}})"), {"\"inputs\"", "object", "array"});
    refused(body_of(R"({"id":3,"inputs":[]})"), {"\"id\"", "number", "string"});
    refused(body_of(R"({"inputs":[{"name":1}]})"), {"inputs[0]", "\"name\""});
    refused(body_of(R"({"inputs":[{"name":"A","datatype":"FP32","shape":"2","data":[1]}]})"),
            {"shape of input A", "string", "array"});
    refused(body_of(R"({"inputs":[{"name":"A","datatype":"FP32","shape":[-2],"data":[]}]})"),
            {"-2", ">= 0"});
  }
  SECTION("datatypes") {
    refused(body_of(R"({"inputs":[{"name":"A","datatype":"BYTES","shape":[1],"data":["x"]}]})"),
            {"input A", "BYTES"});
    refused(body_of(R"({"inputs":[{"name":"A","datatype":"INT8","shape":[1],"data":[300]}]})"),
            {"element 0 of input A", "300", "INT8"});
    refused(body_of(R"({"inputs":[{"name":"A","datatype":"INT32","shape":[1],"data":[1.5]}]})"),
            {"1.5", "INT32"});
    refused(body_of(R"({"inputs":[{"name":"A","datatype":"BOOL","shape":[1],"data":[1]}]})"),
            {"not a BOOL"});
    refused(body_of(R"({"inputs":[{"name":"A","datatype":"FP16","shape":[1],"data":[1]}]})"),
            {"FP16", "binary_data_size"});
    refused(body_of(R"({"inputs":[{"name":"A","datatype":"FP32","shape":[1],"data":[1e300]}]})"),
            {"past the range of FP32"});
  }
  SECTION("element counts") {
    refused(body_of(R"({"inputs":[{"name":"A","datatype":"FP32","shape":[3],"data":[1,2]}]})"),
            {"holds 2 elements", "[3]", "has 3"});
    refused(
        body_of(R"({"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[[[1]],[2]]}]})"),
        {"nests arrays deeper"});
    // A shape past the budget is refused before anything is converted.
    refused(body_of(R"({"inputs":[{"name":"A","datatype":"FP32","shape":[4194304],"data":[]}]})"),
            {"holds 0 elements"});
    refused(
        body_of(
            R"({"inputs":[{"name":"A","datatype":"FP32","shape":[1099511627776,1099511627776],"data":[]}]})"),
        {"overflows 64 bits"});
  }
  SECTION("the budget bounds converted data") {
    memory_budget small(8);
    absl::StatusOr<infer_request> r = parse_infer_request(
        body_of(R"({"inputs":[{"name":"A","datatype":"FP64","shape":[2],"data":[1,2]}]})"), "sum",
        "", small);
    require_status(r.status(), absl::StatusCode::kResourceExhausted, {"16 bytes", "budget"});
    CHECK(small.in_use() == 0);
  }
  SECTION("binary sizes") {
    const std::string json = R"({"inputs":[{"name":"A","shape":[2,2],"datatype":"FP32",)"
                             R"("parameters":{"binary_data_size":12}}]})";
    // shape x datatype disagrees with binary_data_size
    refused(body_of(json, std::string(12, 'x'), true), {"12 bytes", "[2,2]", "takes 16"});
    const std::string json16 = R"({"inputs":[{"name":"A","shape":[2,2],"datatype":"FP32",)"
                               R"("parameters":{"binary_data_size":16}}]})";
    refused(body_of(json16, std::string(8, 'x'), true), {"runs past the body"});
    refused(body_of(json16, std::string(20, 'x'), true), {"4 bytes after", "no input claims"});
    refused(body_of(json16, "", false), {"no Inference-Header-Content-Length"});
    request_body past = body_of(json16, std::string(16, 'x'), true);
    past.header_length = past.length + 1;
    refused(past, {"Inference-Header-Content-Length is", "past the body"});
    refused(body_of(R"({"inputs":[{"name":"A","shape":[1],"datatype":"FP32",)"
                    R"("parameters":{"binary_data_size":-4}}]})",
                    "", true),
            {"binary_data_size of input A", "integer >= 0"});
  }
  SECTION("names and regions") {
    refused(body_of(R"({"inputs":[{"name":"A","datatype":"FP32","shape":[1],"data":[1]},)"
                    R"({"name":"A","datatype":"FP32","shape":[1],"data":[1]}]})"),
            {"input A is given twice"});
    refused(body_of(R"({"inputs":[{"name":"A","datatype":"FP32","shape":[1],)"
                    R"("parameters":{"shared_memory_region":"r"}}]})"),
            {"shared-memory"});
    refused(body_of(R"({"inputs":[{"name":"A","datatype":"FP32","shape":[1]}]})"),
            {"no \"data\", binary_data_size or shared_memory_region"});
  }
  CHECK(budget.in_use() == 0);
}

// A request's input whose bytes are owned by a buffer that counts its
// releases: the owner plays the part of the body or message the server
// would have received.
input_tensor counted_input(const char* name, const char* datatype, std::vector<std::int64_t> shape,
                           int& released) {
  input_tensor in;
  in.name = name;
  in.datatype = datatype;
  in.shape = std::move(shape);
  REQUIRE(complete_input(in).ok());
  auto* bytes = new std::byte[in.bytes + 1]();
  in.data = bytes;
  in.owner = std::shared_ptr<void>(bytes, [&released](void* p) {
    ++released;
    delete[] static_cast<std::byte*>(p);
  });
  return in;
}

TEST_CASE("every input's owner is released exactly once, answered or refused",
          "[examples][kserve]") {
  host_models host;
  const auto run = [&](infer_request r) { return host.run(host.models->infer(std::move(r))); };
  int released = 0;
  SECTION("sum, echo and negate answered") {
    for (const char* model : {"sum", "negate"}) {
      infer_request r;
      r.model = model;
      r.inputs.push_back(counted_input("INPUT0", "FP32", {16}, released));
      absl::StatusOr<infer_response> answer = run(std::move(r));
      REQUIRE(answer.ok());
    }
    infer_request echo;
    echo.model = "echo";
    echo.inputs.push_back(counted_input("INPUT0", "FP32", {2, 3}, released));
    echo.inputs.push_back(counted_input("INPUT1", "INT64", {3}, released));
    {
      absl::StatusOr<infer_response> answer = run(std::move(echo));
      REQUIRE(answer.ok());
      CHECK(released == 2);  // echo's outputs view its inputs until answered
    }
    CHECK(released == 4);
  }
  SECTION("refused by the metadata") {
    infer_request r;
    r.model = "sum";
    r.inputs.push_back(counted_input("INPUT0", "INT32", {4}, released));
    require_status(run(std::move(r)).status(), absl::StatusCode::kInvalidArgument,
                   {"is FP32; the request sends INT32"});
    CHECK(released == 1);
  }
}

TEST_CASE("a serialized request is answered, its room held until its tensors are released",
          "[examples][kserve]") {
  // Made before the runtime, so that they outlive every deleter it runs.
  const shm_registry shm(false);
  memory_budget budget(1 << 20);
  buffer_pool pool(0);
  int rooms_released = 0;
  host_models host;
  const message_server server{*host.models, shm, budget, pool};
  // The bytes as the UCX transport hands them over: granted from the budget.
  const auto answer = [&](const std::vector<std::byte>& message) {
    REQUIRE(budget.try_acquire(message.size()));
    std::shared_ptr<void> room(nullptr, [&, n = message.size()](void*) {
      budget.release(n);
      ++rooms_released;
    });
    auto bytes = std::make_unique<std::byte[]>(std::max<std::size_t>(message.size(), 1));
    std::memcpy(bytes.get(), message.data(), message.size());
    return host.run(server.answer_serialized(
        serialized_message::of(std::move(bytes), message.size()), std::move(room)));
  };
  SECTION("sum") {
    const std::vector<float> values{1, 2, 3, 4.5F};
    const absl::StatusOr<std::string> r = answer(serialize(sum_request("seven", values)));
    REQUIRE(r.ok());
    const absl::StatusOr<double> sum = sum_of(*r, "seven");
    REQUIRE(sum.ok());
    CHECK(*sum == 10.5);
    require_status(sum_of(*r, "eight").status(), absl::StatusCode::kInvalidArgument,
                   {"the request's \"eight\""});
  }
  SECTION("echo returns the raw contents it was sent") {
    inference::ModelInferRequest m;
    m.set_model_name("echo");
    auto* in0 = m.add_inputs();
    in0->set_name("INPUT0");
    in0->set_datatype("FP32");
    in0->add_shape(1);
    in0->add_shape(2);
    auto* in1 = m.add_inputs();
    in1->set_name("INPUT1");
    in1->set_datatype("INT64");
    in1->add_shape(1);
    m.add_raw_input_contents()->assign(floats_bytes({5, -6}));
    const std::int64_t seven = 7;
    m.add_raw_input_contents()->assign(reinterpret_cast<const char*>(&seven), sizeof seven);
    const absl::StatusOr<std::string> r = answer(serialize(m));
    REQUIRE(r.ok());
    inference::ModelInferResponse response;
    REQUIRE(response.ParseFromString(*r));
    REQUIRE(response.raw_output_contents_size() == 2);
    CHECK(response.raw_output_contents(0) == floats_bytes({5, -6}));
    CHECK(response.raw_output_contents(1) ==
          std::string(reinterpret_cast<const char*>(&seven), sizeof seven));
  }
  SECTION("bytes that are no request") {
    const std::vector<std::byte> garbage(16, std::byte{0xFF});
    require_status(answer(garbage).status(), absl::StatusCode::kInvalidArgument,
                   {"the bytes are not a ModelInferRequest"});
  }
  SECTION("a message of many tiny fields: refused before it is parsed into far more memory") {
    // 20,000 empty inputs: 40 KB on the wire, megabytes once parsed.
    inference::ModelInferRequest m;
    m.set_model_name("sum");
    for (int i = 0; i < 20000; ++i) m.add_inputs();
    const std::vector<std::byte> bytes = serialize(m);
    const absl::StatusOr<std::uint64_t> bound =
        parsed_bytes_bound(*inference::ModelInferRequest::descriptor(), bytes.data(), bytes.size());
    REQUIRE(bound.ok());
    CHECK(*bound > 20 * bytes.size());
    require_status(answer(bytes).status(), absl::StatusCode::kResourceExhausted,
                   {"once parsed (many small fields)", "raw_input_contents"});
  }
  SECTION("a field the message does not have: refused before it is parsed") {
    std::vector<std::byte> bytes = serialize(sum_request("x", std::vector<float>{1, 2}));
    // Field 99, varint 1: a tag of two bytes, then the value.
    for (const std::uint8_t b : {std::uint8_t{0x98}, std::uint8_t{0x06}, std::uint8_t{0x01}}) {
      bytes.push_back(std::byte{b});
    }
    require_status(answer(bytes).status(), absl::StatusCode::kInvalidArgument,
                   {"field 99 is not one of inference.ModelInferRequest's"});
  }
  SECTION("a message of tensors: its bound is about its size") {
    const std::vector<float> values(4096, 1.0F);
    const std::vector<std::byte> bytes = serialize(sum_request("x", values));
    const absl::StatusOr<std::uint64_t> bound =
        parsed_bytes_bound(*inference::ModelInferRequest::descriptor(), bytes.data(), bytes.size());
    REQUIRE(bound.ok());
    CHECK(*bound >= values.size() * sizeof(float));
    CHECK(*bound < 2 * bytes.size());
    REQUIRE(answer(bytes).ok());
  }
  SECTION("a message in pieces (gRPC's slices) is bounded and answered as in one") {
    inference::ModelInferRequest m = sum_request("p", std::vector<float>(1000, 2.0F));
    const std::vector<std::byte> whole = serialize(m);
    const auto in_pieces = [&](const std::vector<std::byte>& bytes, std::size_t cut) {
      serialized_message s;
      auto copy = std::make_shared<std::vector<std::byte>>(bytes);
      for (std::size_t at = 0; at < copy->size(); at += cut) {
        s.pieces.emplace_back(copy->data() + at, std::min(cut, copy->size() - at));
      }
      s.owner = copy;
      return s;
    };
    for (const std::size_t cut : {std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
      const serialized_message s = in_pieces(whole, cut);
      const absl::StatusOr<std::uint64_t> bound =
          parsed_bytes_bound(*inference::ModelInferRequest::descriptor(), s.pieces);
      REQUIRE(bound.ok());
      CHECK(*bound == *parsed_bytes_bound(*inference::ModelInferRequest::descriptor(), whole.data(),
                                          whole.size()));
    }
    REQUIRE(budget.try_acquire(whole.size()));
    std::shared_ptr<void> room(nullptr, [&, n = whole.size()](void*) {
      budget.release(n);
      ++rooms_released;
    });
    const absl::StatusOr<std::string> r =
        host.run(server.answer_serialized(in_pieces(whole, 7), std::move(room)));
    REQUIRE(r.ok());
    CHECK(*sum_of(*r, "p") == 2000.0);
    // Tiny fields in pieces are refused as in one.
    inference::ModelInferRequest tiny;
    tiny.set_model_name("sum");
    for (int i = 0; i < 20000; ++i) tiny.add_inputs();
    const std::vector<std::byte> tiny_bytes = serialize(tiny);
    REQUIRE(budget.try_acquire(tiny_bytes.size()));
    std::shared_ptr<void> tiny_room(nullptr,
                                    [&, n = tiny_bytes.size()](void*) { budget.release(n); });
    require_status(
        host.run(server.answer_serialized(in_pieces(tiny_bytes, 4096), std::move(tiny_room)))
            .status(),
        absl::StatusCode::kResourceExhausted, {"once parsed (many small fields)"});
  }
  SECTION("a request the model refuses") {
    inference::ModelInferRequest m = sum_request("x", std::vector<float>{1, 2});
    m.mutable_inputs(0)->set_datatype("INT32");
    require_status(answer(serialize(m)).status(), absl::StatusCode::kInvalidArgument,
                   {"the request sends INT32"});
  }
  CHECK(rooms_released == 1);
  CHECK(budget.in_use() == 0);
}

TEST_CASE("the UCX transport's header is 16 bytes, read back as written", "[examples][kserve]") {
  const auto bytes = ucx_response_header(0x0102030405060708, absl::StatusCode::kNotFound).encode();
  const std::optional<ucx_header> h = ucx_header::decode(bytes);
  REQUIRE(h.has_value());
  CHECK(h->magic == ucx_response_magic);
  CHECK(h->word == 5);
  CHECK(h->tag == 0x0102030405060708);
  CHECK_FALSE(ucx_header::decode(std::span(bytes).first(15)).has_value());
  const std::vector<std::byte> longer(17);
  CHECK_FALSE(ucx_header::decode(longer).has_value());
  // "KV2Q" in memory, as the wire format says.
  const auto request = ucx_request_header(1).encode();
  CHECK(std::memcmp(request.data(), "KV2Q", 4) == 0);
}

TEST_CASE("responses encode JSON data or binary data with its size", "[examples][kserve]") {
  infer_response r;
  r.model = "echo";
  r.version = "1";
  r.id = "a";
  const std::string f = floats_bytes({0.5F, -2.0F});
  const std::int64_t i64[2] = {-3, 1LL << 40};
  r.outputs.push_back({"OUTPUT0",
                       "FP32",
                       {2},
                       {reinterpret_cast<const std::byte*>(f.data()), 8},
                       nullptr,
                       false,
                       std::nullopt});
  r.outputs.push_back({"OUTPUT1",
                       "INT64",
                       {2},
                       {reinterpret_cast<const std::byte*>(i64), sizeof i64},
                       nullptr,
                       true,
                       std::nullopt});
  encoded_response e = encode_infer_response(r);
  CHECK(e.json ==
        R"({"id":"a","model_name":"echo","model_version":"1","outputs":[{"data":[0.5,-2.0],)"
        R"("datatype":"FP32","name":"OUTPUT0","shape":[2]},{"datatype":"INT64","name":"OUTPUT1",)"
        R"("parameters":{"binary_data_size":16},"shape":[2]}]})");
  REQUIRE(e.binary.size() == 1);
  CHECK(e.binary[0].size() == 16);
  CHECK(encode_error("bad \xff byte") == "{\"error\":\"bad \xEF\xBF\xBD byte\"}");
}

// A POSIX shared-memory object of `size` bytes, removed at the end.
class shm_object {
 public:
  explicit shm_object(std::size_t size)
      : key_("/dlasync_test_" + std::to_string(::getpid()) + "_" + std::to_string(next_++)) {
    const int fd = ::shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(size)) == 0);
    std::string bytes(size, '\0');
    for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i);
    REQUIRE(::pwrite(fd, bytes.data(), size, 0) == static_cast<ssize_t>(size));
    ::close(fd);
  }
  shm_object(const shm_object&) = delete;
  shm_object& operator=(const shm_object&) = delete;
  ~shm_object() { ::shm_unlink(key_.c_str()); }
  const std::string& key() const { return key_; }
  void shrink(std::size_t size) const {
    const int fd = ::shm_open(key_.c_str(), O_RDWR, 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(size)) == 0);
    ::close(fd);
  }

 private:
  static inline int next_ = 0;
  std::string key_;
};

TEST_CASE("shared-memory regions are off unless allowed", "[examples][kserve][shm]") {
  shm_registry off(false);
  shm_object object(64);
  require_status(off.add("r", object.key(), 0, 64), absl::StatusCode::kPermissionDenied,
                 {"--allow_client_shm"});
  require_status(off.status(std::nullopt).status(), absl::StatusCode::kPermissionDenied,
                 {"--allow_client_shm"});
}

TEST_CASE("a region's bounds are checked when registered and when read",
          "[examples][kserve][shm]") {
  shm_registry shm(true);
  shm_object object(4096);
  REQUIRE(shm.add("r", object.key(), 1024, 2048).ok());
  // Registering the same name twice is refused; the first stays.
  require_status(shm.add("r", object.key(), 0, 16), absl::StatusCode::kAlreadyExists,
                 {"\"r\" is registered already"});
  require_status(shm.add("big", object.key(), 4000, 100), absl::StatusCode::kInvalidArgument,
                 {"100 bytes from offset 4000", "4096 bytes"});
  require_status(shm.add("wrap", object.key(), ~std::uint64_t{0}, 2),
                 absl::StatusCode::kInvalidArgument, {"offset"});
  // No key appears in an error.
  const absl::Status missing = shm.add("gone", "/dlasync_no_such_object_here", 0, 1);
  require_status(missing, absl::StatusCode::kNotFound, {"\"gone\"", "No such file"});
  CHECK(missing.message().find("no_such_object") == std::string::npos);
  require_status(shm.add("bad", "/a/b", 0, 1), absl::StatusCode::kInvalidArgument,
                 {"one leading '/'"});
  require_status(shm.add("bad", "relative", 0, 1), absl::StatusCode::kInvalidArgument,
                 {"one leading '/'"});

  std::byte out[16];
  REQUIRE(shm.read({"r", 8, 16}, out).ok());
  CHECK(static_cast<unsigned char>(out[0]) == static_cast<unsigned char>(1024 + 8));
  require_status(shm.read({"r", 2040, 16}, out), absl::StatusCode::kInvalidArgument,
                 {"holds 2048 bytes", "16 bytes from offset 2040"});
  require_status(shm.read({"r", ~std::uint64_t{0} - 4, 16}, out),
                 absl::StatusCode::kInvalidArgument, {"past its end"});
  require_status(shm.read({"nope", 0, 1}, out), absl::StatusCode::kNotFound,
                 {"\"nope\" is not registered"});
  // The client shrinks its object: a read past the new end is refused, not
  // a crash.
  object.shrink(1500);
  require_status(shm.read({"r", 1000, 16}, out), absl::StatusCode::kInvalidArgument,
                 {"no longer holds", "register it again"});
  const std::byte small[4] = {};
  require_status(shm.write({"r", 1000, 4}, small), absl::StatusCode::kInvalidArgument,
                 {"no longer holds"});
  REQUIRE(shm.write({"r", 0, 4}, small).ok());

  absl::StatusOr<std::vector<shm_region_info>> all = shm.status(std::nullopt);
  REQUIRE(all.ok());
  REQUIRE(all->size() == 1);
  CHECK((*all)[0].key == object.key());
  REQUIRE(shm.remove("r").ok());
  require_status(shm.remove("r"), absl::StatusCode::kNotFound, {"not registered"});
}

TEST_CASE("inputs read from shared memory take the budget and name the input",
          "[examples][kserve][shm]") {
  shm_registry shm(true);
  shm_object object(64);
  REQUIRE(shm.add("r", object.key(), 0, 64).ok());
  memory_budget budget(1 << 20);
  buffer_pool pool(1 << 20);
  {
    absl::StatusOr<infer_request> r = parse_infer_request(
        body_of(R"({"inputs":[{"name":"A","datatype":"UINT8","shape":[4],"parameters":)"
                R"({"shared_memory_region":"r","shared_memory_byte_size":4,)"
                R"("shared_memory_offset":10}}]})"),
        "sum", "", budget);
    REQUIRE(r.ok());
    REQUIRE(read_inputs(*r, shm, budget, pool).ok());
    CHECK(static_cast<int>(r->inputs[0].data[0]) == 10);
    CHECK(static_cast<int>(r->inputs[0].data[3]) == 13);
    CHECK(budget.in_use() == 4);
  }
  CHECK(budget.in_use() == 0);
  absl::StatusOr<infer_request> past = parse_infer_request(
      body_of(R"({"inputs":[{"name":"A","datatype":"UINT8","shape":[8],"parameters":)"
              R"({"shared_memory_region":"r","shared_memory_byte_size":8,)"
              R"("shared_memory_offset":60}}]})"),
      "sum", "", budget);
  REQUIRE(past.ok());
  require_status(read_inputs(*past, shm, budget, pool), absl::StatusCode::kInvalidArgument,
                 {"input A", "past its end"});
  CHECK(budget.in_use() == 0);
  require_status(
      parse_infer_request(body_of(R"({"inputs":[{"name":"A","datatype":"FP32","shape":[4],)"
                                  R"("parameters":{"shared_memory_region":"r",)"
                                  R"("shared_memory_byte_size":8}}]})"),
                          "sum", "", budget)
          .status(),
      absl::StatusCode::kInvalidArgument,
      {"shared_memory_byte_size of input A is 8 bytes", "takes 16"});
  require_status(parse_infer_request(
                     body_of(R"({"inputs":[{"name":"A","datatype":"FP32","shape":[1],"data":[1],)"
                             R"("parameters":{"shared_memory_region":"r",)"
                             R"("shared_memory_byte_size":4}}]})"),
                     "sum", "", budget)
                     .status(),
                 absl::StatusCode::kInvalidArgument, {"more than one way"});
}

}  // namespace
}  // namespace dlasync::examples::kserve

namespace dlasync::examples {
namespace {

std::size_t feed_all(http_parse& p, const std::string& text, std::size_t from = 0) {
  return p.feed(text.data() + from, text.size() - from);
}

TEST_CASE("a buffer pool hands a freed block out again, within its bound", "[examples][http]") {
  buffer_pool pool(std::uint64_t{256} << 10);
  int released = 0;
  std::byte* first = nullptr;
  {
    std::shared_ptr<std::byte[]> a = pool.take(100000, [&] { ++released; });
    first = a.get();
    a[99999] = std::byte{1};
  }
  CHECK(released == 1);
  CHECK(pool.cached() == 131072);  // its size class
  {
    std::shared_ptr<std::byte[]> b = pool.take(70000, [&] { ++released; });
    CHECK(b.get() == first);  // the same class: the same block
    CHECK(pool.cached() == 0);
    std::shared_ptr<std::byte[]> c = pool.take(200000, [&] { ++released; });  // 256 KiB
    std::shared_ptr<std::byte[]> d = pool.take(10, nullptr);                  // not pooled
  }
  CHECK(released == 3);
  // c's 256 KiB came back first and fill the bound; b's 128 KiB were freed.
  CHECK(pool.cached() == 262144);
}

TEST_CASE("pipelined requests are read one at a time, each head before its body",
          "[examples][http]") {
  const std::string two =
      "POST /v2/models/sum/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
      "Inference-Header-Content-Length: 5 \r\n\r\nhelloGET /v2/health/live HTTP/1.1\r\n\r\n";
  http_parse p(1024, 1024);
  std::size_t at = feed_all(p, two);
  REQUIRE(p.at() == http_parse::stage::head_done);
  CHECK(p.head().method == "POST");
  CHECK(p.head().path() == "/v2/models/sum/infer");
  CHECK(p.head().content_length == 5);
  REQUIRE(p.head().header("inference-header-content-length") != nullptr);
  CHECK(*p.head().header("inference-header-content-length") == "5");
  CHECK(p.body_received() == 0);  // nothing of the body is taken yet
  std::byte body[5];
  p.body_into(body);
  p.go_on();
  at += feed_all(p, two, at);
  REQUIRE(p.at() == http_parse::stage::complete);
  CHECK(std::memcmp(body, "hello", 5) == 0);
  p.next();
  at += feed_all(p, two, at);
  REQUIRE(p.at() == http_parse::stage::head_done);
  CHECK(p.head().method == "GET");
  CHECK_FALSE(p.head().content_length.has_value());
  p.go_on();
  at += feed_all(p, two, at);
  CHECK(p.at() == http_parse::stage::complete);
  CHECK(at == two.size());
}

TEST_CASE("a chunked body is gathered up to its limit", "[examples][http]") {
  const std::string head = "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::string chunks = "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
  {
    http_parse p(1024, 5);
    std::size_t at = feed_all(p, head + chunks);
    REQUIRE(p.at() == http_parse::stage::head_done);
    CHECK(p.head().chunked);
    p.go_on();
    feed_all(p, head + chunks, at);
    REQUIRE(p.at() == http_parse::stage::complete);
    CHECK(p.chunked_body().size() == 5);
  }
  http_parse small(1024, 4);
  const std::size_t at = feed_all(small, head + chunks);
  small.go_on();
  feed_all(small, head + chunks, at);
  CHECK(small.at() == http_parse::stage::failed);
  CHECK(small.body_too_large());
}

TEST_CASE("a head past the limit, or malformed, fails the parse", "[examples][http]") {
  http_parse p(64, 1024);
  feed_all(p, "GET /v2 HTTP/1.1\r\nX-Long: " + std::string(100, 'a'));
  CHECK(p.at() == http_parse::stage::failed);
  CHECK(p.head_too_large());
  http_parse bad(1024, 1024);
  feed_all(bad, "GET /v2 HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n");
  CHECK(bad.at() == http_parse::stage::failed);
  CHECK_FALSE(bad.error().empty());
  http_parse smuggled(1024, 1024);
  feed_all(smuggled,
           "POST /v2 HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n");
  CHECK(smuggled.at() == http_parse::stage::failed);
}

}  // namespace
}  // namespace dlasync::examples
