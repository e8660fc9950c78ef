#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "net/asio.h"
#include "payout-demo/rail.h"

namespace fencelock::payout {

struct RailClient::Impl {
  asio::io_context io;
  asio::ip::tcp::endpoint endpoint;
  std::optional<asio::ip::tcp::socket> socket;
  asio::streambuf in{kMaxRailLine + 1};

  // Runs the queued operations for at most `timeout`; false if they did not all finish, in
  // which case the connection is closed (its state is unknown) and the aborted operations are
  // drained.
  bool RunFor(absl::Duration timeout) {
    io.restart();
    io.run_for(absl::ToChronoMilliseconds(timeout));
    if (io.stopped()) return true;
    Close();
    io.restart();
    io.run();
    return false;
  }
  void Close() {
    if (socket) {
      boost::system::error_code ignored;
      socket->close(ignored);
      socket.reset();
    }
    in.consume(in.size());
  }

  absl::Status Connect(absl::Duration timeout) {
    Close();
    socket.emplace(io);
    boost::system::error_code result = asio::error::would_block;
    socket->async_connect(endpoint, [&](boost::system::error_code ec) { result = ec; });
    if (!RunFor(timeout)) {
      return absl::UnavailableError(absl::StrCat("rail at ", endpoint.address().to_string(), ":",
                                                 endpoint.port(), ": connect timed out"));
    }
    if (result) {
      Close();
      return absl::UnavailableError(absl::StrCat("rail at ", endpoint.address().to_string(), ":",
                                                 endpoint.port(), ": ", result.message()));
    }
    socket->set_option(asio::ip::tcp::no_delay(true));
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Exchange(const std::string& line, absl::Duration timeout) {
    const std::string out = line + "\n";
    boost::system::error_code write_ec = asio::error::would_block;
    boost::system::error_code read_ec = asio::error::would_block;
    asio::async_write(*socket, asio::buffer(out),
                      [&](boost::system::error_code ec, size_t) { write_ec = ec; });
    asio::async_read_until(*socket, in, '\n',
                           [&](boost::system::error_code ec, size_t) { read_ec = ec; });
    if (!RunFor(timeout)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rail did not answer \"", line, "\" within ", absl::FormatDuration(timeout)));
    }
    if (write_ec || read_ec) {
      const std::string why = (write_ec ? write_ec : read_ec).message();
      Close();
      return absl::UnavailableError(absl::StrCat("rail connection failed: ", why));
    }
    std::istream stream(&in);
    std::string reply;
    std::getline(stream, reply);
    return reply;
  }
};

RailClient::RailClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RailClient::~RailClient() = default;

absl::StatusOr<std::unique_ptr<RailClient>> RailClient::Connect(const std::string& address,
                                                                absl::Duration connect_timeout) {
  const size_t colon = address.rfind(':');
  int port = 0;
  boost::system::error_code ec;
  auto impl = std::make_unique<Impl>();
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("rail address \"", address, "\" is not host:port"));
  }
  const auto ip = asio::ip::make_address(address.substr(0, colon), ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("rail address \"", address, "\": ", ec.message()));
  }
  impl->endpoint = asio::ip::tcp::endpoint(ip, static_cast<uint16_t>(port));
  if (absl::Status s = impl->Connect(connect_timeout); !s.ok()) return s;
  auto hello = impl->Exchange("HELLO", connect_timeout);
  if (!hello.ok()) return hello.status();
  auto reply = ParseRailReply(*hello);
  if (!reply.ok()) return reply.status();
  if (reply->kind != RailReply::Kind::kHello) {
    return absl::FailedPreconditionError(absl::StrCat("rail answered HELLO with \"", *hello, "\""));
  }
  std::unique_ptr<RailClient> client(new RailClient(std::move(impl)));
  client->read_timeout_ = absl::Milliseconds(reply->read_timeout_ms);
  return client;
}

absl::StatusOr<RailReply> RailClient::Call(const RailRequest& request) {
  if (!impl_->socket) {
    if (absl::Status s = impl_->Connect(read_timeout_); !s.ok()) return s;
  }
  auto line = impl_->Exchange(FormatRailRequest(request), read_timeout_);
  if (!line.ok()) return line.status();
  return ParseRailReply(*line);
}

}  // namespace fencelock::payout
