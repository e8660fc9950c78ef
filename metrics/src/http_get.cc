#include "metrics/http_get.h"

// Boost 1.74's Asio needs <utility> first under GCC 12 in C++20 (net/asio.h says why).
#include <utility>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace fencelock::metrics {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

// Bodies larger than this are refused: a /metrics page or an API answer is far smaller.
constexpr uint64_t kMaxBodyBytes = uint64_t{64} << 20;

// One GET on Beast, its steps chained on an io_context of its own that runs for at most the
// timeout on the steady clock, so that no step (resolve, connect, write, read) can outlast it.
class Get {
 public:
  Get(const std::string& host, int port, const std::string& path)
      : host_(host), port_(port), where_(absl::StrCat("http://", host, ":", port, path)),
        request_(http::verb::get, path, 10) {
    request_.set(http::field::host, host);
    request_.set(http::field::connection, "close");
    parser_.body_limit(kMaxBodyBytes);
  }

  absl::StatusOr<HttpResponse> Run(absl::Duration timeout) {
    resolver_.async_resolve(host_, std::to_string(port_),
                            [this](beast::error_code ec, tcp::resolver::results_type found) {
                              if (ec) return End(ec, "cannot resolve ");
                              OnResolved(found);
                            });
    io_.run_for(absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration())));
    if (!outcome_.has_value()) {
      return absl::DeadlineExceededError(absl::StrCat(stage_, where_, " timed out after ",
                                                      absl::FormatDuration(timeout)));
    }
    return std::move(*outcome_);
  }

 private:
  void OnResolved(const tcp::resolver::results_type& found) {
    stage_ = "connecting to ";
    stream_.async_connect(found, [this](beast::error_code ec, const tcp::endpoint&) {
      if (ec) return End(ec, "cannot connect to ");
      stage_ = "sending to ";
      http::async_write(stream_, request_, [this](beast::error_code ec, size_t) {
        if (ec) return End(ec, "sending to ");
        stage_ = "waiting for a complete reply from ";
        http::async_read(stream_, buffer_, parser_,
                         [this](beast::error_code ec, size_t) { OnRead(ec); });
      });
    });
  }

  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream) {
      return Fail(absl::UnavailableError(absl::StrCat(where_, " closed without a reply")));
    }
    if (ec == http::error::partial_message) {
      if (!parser_.is_header_done()) {
        return Fail(absl::DataLossError(absl::StrCat(where_, ": the reply ends inside its headers")));
      }
      return Fail(absl::DataLossError(absl::StrCat(
          where_, ": the body ends after ", parser_.get().body().size(), " of its ",
          parser_.content_length().value_or(0), " bytes")));
    }
    if (ec == http::error::body_limit) {
      return Fail(absl::DataLossError(
          absl::StrCat(where_, ": the body is over ", kMaxBodyBytes, " bytes")));
    }
    if (ec && ec.category() == http::make_error_code(http::error::bad_version).category()) {
      // Beast keeps what it could not parse in the buffer: show its start.
      const auto data = buffer_.data();
      const std::string head(static_cast<const char*>(data.data()),
                             std::min<size_t>(data.size(), 80));
      return Fail(absl::DataLossError(absl::StrCat(where_, " did not answer HTTP (",
                                                   ec.message(), "): \"", absl::CHexEscape(head),
                                                   "\"")));
    }
    if (ec) return End(ec, "reading from ");
    HttpResponse response;
    response.status = static_cast<int>(parser_.get().result_int());
    response.body = std::move(parser_.get().body());
    Finish(std::move(response));
  }

  void End(beast::error_code ec, const char* doing) {
    Fail(absl::UnavailableError(absl::StrCat(doing, where_, ": ", ec.message())));
  }
  void Fail(absl::Status status) { Finish(std::move(status)); }
  void Finish(absl::StatusOr<HttpResponse> outcome) {
    outcome_ = std::move(outcome);
    io_.stop();
  }

  const std::string host_;
  const int port_;
  const std::string where_;
  asio::io_context io_{1};
  tcp::resolver resolver_{io_};
  beast::tcp_stream stream_{io_};
  http::request<http::empty_body> request_;
  beast::flat_buffer buffer_;
  http::response_parser<http::string_body> parser_;
  const char* stage_ = "resolving ";
  std::optional<absl::StatusOr<HttpResponse>> outcome_;
};

}  // namespace

absl::StatusOr<HttpResponse> HttpGet(const std::string& host, int port, const std::string& path,
                                     absl::Duration timeout) {
  if (port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad port in http://", host, ":", port, path));
  }
  return Get(host, port, path).Run(timeout);
}

absl::StatusOr<double> FindSample(const std::string& exposition, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::ConsumePrefix(&line, series) || line.empty() || line[0] != ' ') continue;
    // "<series> <value>" or "<series> <value> <timestamp>"
    std::vector<absl::string_view> fields =
        absl::StrSplit(absl::StripAsciiWhitespace(line), ' ', absl::SkipEmpty());
    double value = 0;
    if (fields.empty() || !absl::SimpleAtod(fields[0], &value)) {
      return absl::DataLossError(absl::StrCat(series, " has no numeric value: \"",
                                              absl::CHexEscape(line.substr(0, 80)), "\""));
    }
    return value;
  }
  return absl::NotFoundError(absl::StrCat("no series ", series));
}

absl::StatusOr<double> ScrapeSample(const std::string& host, int port, const std::string& series,
                                    absl::Duration timeout) {
  auto page = HttpGet(host, port, "/metrics", timeout);
  if (!page.ok()) return page.status();
  if (page->status != 200) {
    return absl::UnavailableError(absl::StrCat("http://", host, ":", port, "/metrics answered ",
                                               page->status));
  }
  auto value = FindSample(page->body, series);
  if (!value.ok()) {
    return absl::Status(value.status().code(), absl::StrCat(value.status().message(), " in http://",
                                                            host, ":", port, "/metrics"));
  }
  return value;
}

}  // namespace fencelock::metrics
