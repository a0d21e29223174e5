#include "peer_io.hpp"

#include <algorithm>
#include <optional>
#include <tuple>
#include <vector>

#include "asio/experimental/as_tuple.hpp"
#include "asio/read.hpp"
#include "asio/use_awaitable.hpp"
#include "asio/write.hpp"
#include "deadline.hpp"

namespace dlasync::examples {
namespace {

constexpr auto as_tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);

}  // namespace

asio::awaitable<peer_io::got> peer_io::read_until(asio::mutable_buffer buffer,
                                                  deadline_clock::time_point deadline) {
  std::optional<std::tuple<asio::error_code, std::size_t>> read =
      co_await before(deadline, asio::async_read(socket_, buffer, as_tuple_awaitable));
  if (!read) co_return got::late;
  co_return std::get<0>(*read) ? got::closed : got::all;
}

asio::awaitable<peer_io::got> peer_io::read(asio::mutable_buffer buffer) {
  const got read = co_await read_until(buffer, deadline_after(deadlines_.read));
  co_return read;
}

asio::awaitable<peer_io::got> peer_io::read_header(
    std::array<std::byte, frame_header_bytes>& header) {
  std::optional<std::tuple<asio::error_code, std::size_t>> first =
      co_await before(deadline_after(deadlines_.idle),
                      socket_.async_read_some(asio::buffer(header), as_tuple_awaitable));
  if (!first) co_return got::idle;
  const auto [ec, n] = *first;
  if (ec) co_return got::closed;
  if (n == header.size()) co_return got::all;
  const got rest = co_await read(asio::buffer(header.data() + n, header.size() - n));
  co_return rest;
}

asio::awaitable<peer_io::got> peer_io::body_arriving(std::uint32_t length) {
  asio::error_code ec;
  if (length == 0 || socket_.available(ec) > 0 || ec) co_return got::all;
  std::optional<std::tuple<asio::error_code>> ready =
      co_await before(deadline_after(deadlines_.read),
                      socket_.async_wait(asio::ip::tcp::socket::wait_read, as_tuple_awaitable));
  if (!ready) co_return got::late;
  co_return std::get<0>(*ready) ? got::closed : got::all;
}

asio::awaitable<peer_io::got> peer_io::discard(std::uint64_t bytes) {
  const deadline_clock::time_point deadline = deadline_after(deadlines_.read);
  std::array<std::byte, std::size_t{64} * 1024> scratch;
  while (bytes > 0) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(bytes, scratch.size()));
    const got part = co_await read_until(asio::buffer(scratch.data(), n), deadline);
    if (part != got::all) co_return part;
    bytes -= n;
  }
  co_return got::all;
}

asio::awaitable<peer_io::got> peer_io::send(const response& r) {
  const std::vector<std::byte> frame = encode_response(r);
  std::optional<std::tuple<asio::error_code, std::size_t>> sent =
      co_await before(deadline_after(deadlines_.read),
                      asio::async_write(socket_, asio::buffer(frame), as_tuple_awaitable));
  if (!sent) co_return got::late;
  co_return std::get<0>(*sent) ? got::closed : got::all;
}

}  // namespace dlasync::examples
