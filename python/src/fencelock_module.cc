// The `fencelock` Python module: the client library's contract (ADR-006) for Python workers,
// on the same C++ client: the send-time deadline, check_still_held, the step check (D4), and
// the loss and refusal exceptions. Every call that may wait on lockd releases the GIL.
//
//   client = fencelock.Client(server="127.0.0.1:7420", session_ttl=15, margin=0.3)
//   with client.lock("payout-42", wait=5) as lock:
//       lock.check_still_held()
//       lock.begin_irreversible_step("rail_submit", worst_case=2.5)
//       pay(token=lock.token)
//
// Durations are seconds (int or float) or datetime.timedelta.
#include <utility>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "lock-client/client.h"
#include "metrics/metrics.h"

namespace py = pybind11;

namespace fencelock::python {
namespace {

// The Python exception types, made once when the module loads.
PyObject* g_error = nullptr;            // fencelock.Error: a call that lockd or the client refused
PyObject* g_timeout = nullptr;          // fencelock.AcquireTimeoutError: the wait ran out
PyObject* g_lock_lost = nullptr;        // fencelock.LockLostError
PyObject* g_step_refused = nullptr;     // fencelock.StepRefusedError (a LockLostError)
PyObject* g_timedelta = nullptr;        // datetime.timedelta, looked up once

// Raises `type(message)` with the given attributes set on the exception object.
[[noreturn]] void Raise(PyObject* type, const std::string& message,
                        const std::map<std::string, py::object>& attributes) {
  py::object error = py::reinterpret_borrow<py::object>(type)(message);
  for (const auto& [name, value] : attributes) error.attr(name.c_str()) = value;
  PyErr_SetObject(type, error.ptr());
  throw py::error_already_set();
}

// A non-OK status as fencelock.Error (AcquireTimeoutError for an acquire's wait that ran out),
// its `code` the status code's name ("UNAVAILABLE", ...).
[[noreturn]] void RaiseStatus(const absl::Status& status) {
  PyObject* type = status.code() == absl::StatusCode::kDeadlineExceeded ? g_timeout : g_error;
  Raise(type, status.ToString(),
        {{"code", py::str(absl::StatusCodeToString(status.code()))}});
}

double ToSeconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// A duration argument: seconds as int or float, or a datetime.timedelta. Refuses what is not
// finite, and a negative value, naming the argument.
absl::Duration DurationArg(const py::handle& value, const char* name) {
  double seconds = 0;
  if (PyObject_IsInstance(value.ptr(), g_timedelta) == 1) {
    seconds = value.attr("total_seconds")().cast<double>();
  } else if (PyFloat_Check(value.ptr()) || PyLong_Check(value.ptr())) {
    seconds = value.cast<double>();
  } else {
    throw py::type_error(absl::StrCat(name, " must be seconds (int or float) or a timedelta"));
  }
  if (!std::isfinite(seconds) || seconds < 0) {
    throw py::value_error(absl::StrCat(name, " must be finite and not negative"));
  }
  return absl::Seconds(seconds);
}

absl::Duration OptionalDuration(const py::object& value, const char* name) {
  return value.is_none() ? absl::ZeroDuration() : DurationArg(value, name);
}

// The C++ client, shared by the Python Client and every Lock it granted, so that a lock
// outlives a `del client`; close() ends it for all of them.
struct ClientBox {
  std::shared_ptr<Client> client;

  // The client for one call, kept alive by the call even if close() runs meanwhile. Called
  // with the GIL held, which orders it with close().
  std::shared_ptr<Client> Get() const {
    if (client == nullptr) Raise(g_error, "the client is closed", {{"code", py::str("CANCELLED")}});
    return client;
  }
};

// Runs `call` on `client` without the GIL. Should close() have dropped the client's other
// references meanwhile, this last one is let go before the GIL is taken back: the client's
// destructor may wait for one request timeout.
template <typename Call>
auto Unlocked(std::shared_ptr<Client> client, Call call) {
  py::gil_scoped_release unlocked;
  struct Drop {
    std::shared_ptr<Client>& client;
    ~Drop() { client.reset(); }
  } drop{client};
  return call(*client);
}

class Lock {
 public:
  Lock(std::shared_ptr<ClientBox> box, LockHandle handle)
      : box_(std::move(box)), handle_(std::move(handle)) {}

  const std::string& name() const { return handle_.lock(); }
  uint64_t token() const { return handle_.token(); }
  bool shared() const { return handle_.mode() == LockMode::kShared; }
  const LockHandle& handle() const { return handle_; }

  void CheckStillHeld(bool confirm_with_server) const {
    // The local check is a comparison with the deadline: it keeps the GIL (and close(), which
    // needs it, cannot run meanwhile). A confirmation is a round trip to lockd.
    if (!confirm_with_server) return box_->Get()->checkStillHeld(handle_);
    Unlocked(box_->Get(),
             [&](Client& client) { client.checkStillHeld(handle_, Confirm::kWithServer); });
  }
  void BeginIrreversibleStep(const std::string& step, const py::handle& worst_case) const {
    const StepCost cost{step, DurationArg(worst_case, "worst_case")};
    box_->Get()->beginIrreversibleStep(handle_, cost);  // local, as the local check
  }
  double Remaining() const { return ToSeconds(box_->Get()->remaining(handle_)); }
  void Release() const {
    const absl::Status released =
        Unlocked(box_->Get(), [&](Client& client) { return client.release(handle_); });
    if (!released.ok()) RaiseStatus(released);
  }
  std::string Repr() const {
    return absl::StrCat("<fencelock.Lock ", name(), " token=", token(),
                        shared() ? " shared" : "", ">");
  }

 private:
  std::shared_ptr<ClientBox> box_;
  LockHandle handle_;
};

AcquireOptions Options(const py::object& ttl, bool shared) {
  return AcquireOptions{.mode = shared ? LockMode::kShared : LockMode::kExclusive,
                        .ttl = OptionalDuration(ttl, "ttl")};
}

// How often a blocking acquire looks for signals (Ctrl-C) while it waits.
constexpr std::chrono::milliseconds kSignalCheck(20);

// An asynchronous acquire's result, handed from the client's callback thread to the waiter.
struct Outcome {
  std::mutex mu;
  std::condition_variable done;
  std::optional<absl::StatusOr<LockHandle>> result;
};

class PyClient {
 public:
  PyClient(const std::string& server, const py::object& session_ttl, const py::object& lock_ttl,
           const py::object& margin, const py::object& request_timeout,
           const py::object& connect_timeout, const std::string& name,
           const std::map<std::string, py::object>& steps, const std::string& tls_ca,
           const std::string& tls_cert, const std::string& tls_key,
           const std::string& tls_server_name) {
    ClientOptions options;
    options.server = server;
    if (!session_ttl.is_none()) options.session_ttl = DurationArg(session_ttl, "session_ttl");
    if (!lock_ttl.is_none()) options.default_lock_ttl = DurationArg(lock_ttl, "lock_ttl");
    if (!margin.is_none()) {
      if (!PyFloat_Check(margin.ptr()) && !PyLong_Check(margin.ptr())) {
        throw py::type_error("margin must be a number in (0, 1)");
      }
      options.safety_margin = margin.cast<double>();
    }
    if (!request_timeout.is_none()) {
      options.request_timeout = DurationArg(request_timeout, "request_timeout");
    }
    if (!connect_timeout.is_none()) {
      options.connect_timeout = DurationArg(connect_timeout, "connect_timeout");
    }
    options.client_name = name;
    for (const auto& [step, worst_case] : steps) {
      options.steps.push_back(StepCost{step, DurationArg(worst_case, "a step's worst case")});
    }
    options.tls_ca_file = tls_ca;
    options.tls_cert_file = tls_cert;
    options.tls_key_file = tls_key;
    options.tls_server_name = tls_server_name;
    absl::StatusOr<std::unique_ptr<Client>> created;
    {
      py::gil_scoped_release unlocked;  // connects and opens a session
      created = Client::Create(options);
    }
    if (!created.ok()) RaiseStatus(created.status());
    box_ = std::make_shared<ClientBox>();
    box_->client = std::move(*created);
  }

  // Waits for the grant in slices of kSignalCheck without the GIL, checking for signals
  // between them: Ctrl-C (KeyboardInterrupt) ends the wait within one slice. The acquire is
  // then withdrawn, and a grant that got here first is released at once: a caller that never
  // got the lock must not go on holding it.
  Lock Acquire(const std::string& name, const py::handle& wait, const py::object& ttl,
               bool shared) {
    const absl::Duration w = DurationArg(wait, "wait");
    const AcquireOptions options = Options(ttl, shared);
    if (w == absl::ZeroDuration()) {  // no wait to interrupt (acquireAsync needs one)
      absl::StatusOr<LockHandle> now =
          Unlocked(box_->Get(), [&](Client& client) { return client.acquire(name, w, options); });
      if (!now.ok()) RaiseStatus(now.status());
      return Lock(box_, *std::move(now));
    }
    std::shared_ptr<Client> client = box_->Get();
    auto outcome = std::make_shared<Outcome>();
    std::shared_ptr<PendingAcquire> pending =
        client->acquireAsync(name, w, options, [outcome](absl::StatusOr<LockHandle> r) {
          std::lock_guard<std::mutex> lock(outcome->mu);
          outcome->result = std::move(r);
          outcome->done.notify_all();
        });
    for (;;) {
      bool done = false;
      {
        py::gil_scoped_release unlocked;
        std::unique_lock<std::mutex> lock(outcome->mu);
        // A steady-clock wait: a wall-clock step changes nothing here.
        done = outcome->done.wait_for(lock, kSignalCheck,
                                      [&] { return outcome->result.has_value(); });
      }
      if (done) break;
      if (PyErr_CheckSignals() != 0) {  // the handler raised (KeyboardInterrupt)
        pending->cancel();
        {
          py::gil_scoped_release unlocked;
          std::unique_lock<std::mutex> lock(outcome->mu);
          outcome->done.wait(lock, [&] { return outcome->result.has_value(); });
        }
        if (outcome->result->ok()) {
          py::gil_scoped_release unlocked;
          (void)client->release(**outcome->result);
        }
        throw py::error_already_set();
      }
    }
    absl::StatusOr<LockHandle> granted = std::move(*outcome->result);
    if (!granted.ok()) RaiseStatus(granted.status());
    return Lock(box_, *std::move(granted));
  }

  std::optional<Lock> TryAcquire(const std::string& name, const py::object& ttl, bool shared) {
    const AcquireOptions options = Options(ttl, shared);
    absl::StatusOr<std::optional<LockHandle>> granted =
        Unlocked(box_->Get(), [&](Client& client) { return client.tryAcquire(name, options); });
    if (!granted.ok()) RaiseStatus(granted.status());
    if (!granted->has_value()) return std::nullopt;
    return Lock(box_, **std::move(granted));
  }

  uint64_t SessionId() const { return box_->Get()->sessionId(); }
  std::string MetricsText() const { return box_->Get()->metrics()->TextExposition(); }

  // Ends the session (lockd releases what it still holds) for this client and its locks.
  void Close() {
    std::shared_ptr<Client> client = std::move(box_->client);
    py::gil_scoped_release unlocked;  // the destructor may wait one request timeout
    client.reset();
  }

 private:
  std::shared_ptr<ClientBox> box_;
};

// What `with client.lock(name, wait=...) as lock:` uses: acquires on entry, releases on exit
// (a lock already lost is given back without a request; nothing is raised for it).
class LockContext {
 public:
  LockContext(PyClient& client, std::string name, py::object wait, py::object ttl, bool shared)
      : client_(client), name_(std::move(name)), wait_(std::move(wait)), ttl_(std::move(ttl)),
        shared_(shared) {}

  Lock Enter() {
    lock_.emplace(client_.Acquire(name_, wait_, ttl_, shared_));
    return *lock_;
  }
  bool Exit(const py::object&, const py::object&, const py::object&) {
    if (!lock_.has_value()) return false;
    Lock lock = *std::move(lock_);
    lock_.reset();
    try {
      lock.Release();
    } catch (const py::error_already_set&) {
      // A lock already lost (kAborted) or a lockd out of reach: lockd frees it with its lease.
      // The with-block's own exception, if any, is what the caller needs to see.
    }
    return false;
  }

 private:
  PyClient& client_;
  std::string name_;
  py::object wait_, ttl_;
  bool shared_;
  std::optional<Lock> lock_;
};

PyObject* NewException(py::module_& m, const char* name, PyObject* base, const char* doc) {
  PyObject* type = PyErr_NewExceptionWithDoc(absl::StrCat("fencelock.", name).c_str(), doc,
                                             base, nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(type));
  return type;
}

}  // namespace
}  // namespace fencelock::python

PYBIND11_MODULE(fencelock, m) {
  using namespace fencelock;          // NOLINT: the module's body names the client's types
  using namespace fencelock::python;  // NOLINT
  m.doc() = "fencelock's client: locks with fencing tokens and a conservative lease (ADR-006).";
  g_timedelta = py::object(py::module_::import("datetime").attr("timedelta")).release().ptr();
  g_error = NewException(m, "Error", PyExc_Exception,
                         "A call lockd or the client refused; .code names the status.");
  PyObject* timeout_bases = PyTuple_Pack(2, g_error, PyExc_TimeoutError);
  g_timeout = NewException(m, "AcquireTimeoutError", timeout_bases,
                           "acquire's wait ran out before the lock was granted.");
  Py_DECREF(timeout_bases);
  g_lock_lost = NewException(
      m, "LockLostError", PyExc_Exception,
      "The caller may no longer hold the lock: stop before acting on it. .lock, .token, .reason");
  g_step_refused = NewException(
      m, "StepRefusedError", g_lock_lost,
      "The lease left does not cover the step's worst case (D4). .step, .remaining, .cost");

  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const StepRefusedException& e) {
      Raise(g_step_refused, e.what(),
            {{"lock", py::str(e.lock())}, {"token", py::int_(e.token())},
             {"reason", py::str(LossReasonName(e.reason()))}, {"step", py::str(e.step())},
             {"remaining", py::float_(ToSeconds(e.remaining()))},
             {"cost", py::float_(ToSeconds(e.cost()))}});
    } catch (const LockLostException& e) {
      Raise(g_lock_lost, e.what(),
            {{"lock", py::str(e.lock())}, {"token", py::int_(e.token())},
             {"reason", py::str(LossReasonName(e.reason()))}});
    }
  });

  py::class_<Lock>(m, "Lock", "A granted lock: its name, its fencing token and its lease.")
      .def_property_readonly("name", &Lock::name)
      .def_property_readonly("token", &Lock::token,
                             "The fencing token: above every token issued before this grant.")
      .def_property_readonly("shared", &Lock::shared)
      .def("check_still_held", &Lock::CheckStillHeld, py::arg("confirm_with_server") = false,
           "Returns if the lock may still be held; raises LockLostError otherwise.")
      .def("begin_irreversible_step", &Lock::BeginIrreversibleStep, py::arg("name"),
           py::arg("worst_case"),
           "Call right before an irreversible step: raises StepRefusedError unless the lease "
           "left is longer than worst_case.")
      .def("remaining", &Lock::Remaining, "Seconds of lease left; 0 once lost.")
      .def("release", &Lock::Release)
      .def("__repr__", &Lock::Repr);

  py::class_<LockContext>(m, "_LockContext")
      .def("__enter__", &LockContext::Enter)
      .def("__exit__", &LockContext::Exit);

  py::class_<PyClient>(m, "Client", "One session with lockd.")
      .def(py::init<const std::string&, const py::object&, const py::object&, const py::object&,
                    const py::object&, const py::object&, const std::string&,
                    const std::map<std::string, py::object>&, const std::string&,
                    const std::string&, const std::string&, const std::string&>(),
           py::kw_only(), py::arg("server") = "127.0.0.1:7420",
           py::arg("session_ttl") = py::none(), py::arg("lock_ttl") = py::none(),
           py::arg("margin") = py::none(), py::arg("request_timeout") = py::none(),
           py::arg("connect_timeout") = py::none(), py::arg("name") = "fencelock-python",
           py::arg("steps") = std::map<std::string, py::object>(), py::arg("tls_ca") = "",
           py::arg("tls_cert") = "", py::arg("tls_key") = "", py::arg("tls_server_name") = "")
      .def("acquire", &PyClient::Acquire, py::arg("name"), py::arg("wait"),
           py::kw_only(), py::arg("ttl") = py::none(), py::arg("shared") = false,
           "Waits up to `wait` for the lock; raises AcquireTimeoutError when the wait runs out.")
      .def("try_acquire", &PyClient::TryAcquire, py::arg("name"), py::kw_only(),
           py::arg("ttl") = py::none(), py::arg("shared") = false,
           "The lock if it can be granted at once, else None.")
      .def("release", [](PyClient&, const Lock& lock) { lock.Release(); }, py::arg("lock"))
      .def(
          "lock",
          [](PyClient& client, std::string name, py::object wait, py::object ttl, bool shared) {
            return LockContext(client, std::move(name), std::move(wait), std::move(ttl), shared);
          },
          py::arg("name"), py::arg("wait"), py::kw_only(), py::arg("ttl") = py::none(),
          py::arg("shared") = false, py::keep_alive<0, 1>(),
          "`with client.lock(name, wait=...) as lock:` holds the lock for the block.")
      .def_property_readonly("session_id", &PyClient::SessionId)
      .def("metrics_text", &PyClient::MetricsText,
           "The client's counters in Prometheus's text format.")
      .def("close", &PyClient::Close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyClient& client, py::object, py::object, py::object) {
        client.Close();
        return false;
      });
}
