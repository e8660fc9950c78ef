#include "peers.h"

#include <hiredis/hiredis.h>

#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "lock-server/etcd_client.h"
#include "payout-demo/etcd_cluster.h"

namespace fencelock::bench {
namespace {

// --- Redis -----------------------------------------------------------------------------------

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;
struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;

absl::StatusOr<Context> RedisConnect(int port) {
  const timeval timeout{5, 0};
  Context c(redisConnectWithTimeout("127.0.0.1", port, timeout));
  if (c == nullptr) return absl::ResourceExhaustedError("redis: cannot allocate a context");
  if (c->err != 0) return absl::UnavailableError(absl::StrCat("redis: ", c->errstr));
  if (redisSetTimeout(c.get(), timeout) != REDIS_OK) {
    return absl::UnavailableError("redis: cannot set the timeout");
  }
  return c;
}

// One command, as an argument vector (binary-safe: no format string parsing).
absl::StatusOr<Reply> Command(redisContext* c, std::initializer_list<std::string_view> args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (std::string_view a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  Reply r(static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
  if (r == nullptr) return absl::UnavailableError(absl::StrCat("redis: ", c->errstr));
  if (r->type == REDIS_REPLY_ERROR) {
    return absl::InternalError(absl::StrCat("redis: ", std::string(r->str, r->len)));
  }
  return r;
}

// Deletes KEYS[1] only while it still holds ARGV[1]: a holder never deletes a successor's lock.
constexpr char kCompareAndDelete[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end "
    "return 0";

class RedisCycler : public Cycler {
 public:
  RedisCycler(Context c, std::string sha, int client, bool token)
      : c_(std::move(c)),
        sha_(std::move(sha)),
        key_(absl::StrCat("lock/", client)),
        counter_(absl::StrCat("token/", client)),
        client_(client),
        token_(token) {}

  absl::StatusOr<int64_t> Cycle() override {
    const MonoTime start = Now();
    std::string value;
    if (token_) {
      auto t = Command(c_.get(), {"INCR", counter_});
      if (!t.ok()) return t.status();
      if ((*t)->type != REDIS_REPLY_INTEGER) return absl::InternalError("redis: INCR gave no integer");
      value = absl::StrCat((*t)->integer);
    } else {
      value = absl::StrCat(client_, "-", ++n_);
    }
    auto set = Command(c_.get(), {"SET", key_, value, "NX", "PX", "30000"});
    if (!set.ok()) return set.status();
    if ((*set)->type != REDIS_REPLY_STATUS) {
      return absl::FailedPreconditionError(absl::StrCat("redis: ", key_, " is held"));
    }
    const int64_t took = NanosSince(start);
    auto del = Command(c_.get(), {"EVALSHA", sha_, "1", key_, value});
    if (!del.ok()) return del.status();
    if ((*del)->type != REDIS_REPLY_INTEGER || (*del)->integer != 1) {
      return absl::FailedPreconditionError(absl::StrCat("redis: ", key_, " was not ours to delete"));
    }
    return took;
  }

 private:
  Context c_;
  const std::string sha_, key_, counter_;
  const int client_;
  const bool token_;
  uint64_t n_ = 0;
};

// RESP: a command as an array of bulk strings.
void AppendCommand(std::string* out, std::initializer_list<std::string_view> args) {
  absl::StrAppend(out, "*", args.size(), "\r\n");
  for (std::string_view a : args) {
    absl::StrAppend(out, "$", a.size(), "\r\n");
    out->append(a);
    out->append("\r\n");
  }
}

struct ReaderDeleter {
  void operator()(redisReader* r) const { redisReaderFree(r); }
};

// RedisCycler's two commands on the one-thread driver (RunStreamCycles). Pipelined, the
// compare-and-delete travels in one write with the next cycle's SET, as lockd's pipelined
// Release does with the next Acquire.
class RedisStreamCycler : public StreamCycler {
 public:
  RedisStreamCycler(Context c, std::string sha, int client, bool pipelined)
      : c_(std::move(c)),
        sha_(std::move(sha)),
        key_(absl::StrCat("lock/", client)),
        client_(client),
        pipelined_(pipelined),
        reader_(redisReaderCreate()) {}

  int fd() const override { return c_->fd; }
  void Begin(std::string* out) override { SendSet(out); }

  absl::StatusOr<bool> Feed(std::string_view in, bool stop, std::string* out,
                            std::vector<int64_t>* acquire_ns) override {
    if (reader_ == nullptr) return absl::ResourceExhaustedError("redis: cannot allocate a reader");
    if (redisReaderFeed(reader_.get(), in.data(), in.size()) != REDIS_OK) {
      return absl::DataLossError(absl::StrCat("redis: ", reader_->errstr));
    }
    for (;;) {
      void* r = nullptr;
      if (redisReaderGetReply(reader_.get(), &r) != REDIS_OK) {
        return absl::DataLossError(absl::StrCat("redis: ", reader_->errstr));
      }
      if (r == nullptr) break;
      Reply reply(static_cast<redisReply*>(r));
      if (reply->type == REDIS_REPLY_ERROR) {
        return absl::InternalError(absl::StrCat("redis: ", std::string(reply->str, reply->len)));
      }
      if (awaiting_.empty()) return absl::DataLossError("redis: a reply nobody asked for");
      const bool was_set = awaiting_.front();
      awaiting_.erase(awaiting_.begin());
      if (was_set) {
        if (reply->type != REDIS_REPLY_STATUS) {
          return absl::FailedPreconditionError(absl::StrCat("redis: ", key_, " is held"));
        }
        acquire_ns->push_back(NanosSince(started_));
        AppendCommand(out, {"EVALSHA", sha_, "1", key_, value_});
        awaiting_.push_back(false);
        if (pipelined_ && !stop) SendSet(out);
      } else {
        if (reply->type != REDIS_REPLY_INTEGER || reply->integer != 1) {
          return absl::FailedPreconditionError(absl::StrCat("redis: ", key_, " was not ours to delete"));
        }
        if (!pipelined_ && !stop) SendSet(out);
      }
    }
    return awaiting_.empty();
  }

 private:
  void SendSet(std::string* out) {
    value_ = absl::StrCat(client_, "-", ++n_);
    started_ = Now();
    AppendCommand(out, {"SET", key_, value_, "NX", "PX", "30000"});
    awaiting_.push_back(true);
  }

  Context c_;
  const std::string sha_, key_;
  const int client_;
  const bool pipelined_;
  std::unique_ptr<redisReader, ReaderDeleter> reader_;
  std::vector<bool> awaiting_;  // replies due, oldest first: true for a SET, false for the delete
  std::string value_;           // the SET in flight's (what its delete compares with)
  uint64_t n_ = 0;
  MonoTime started_;
};

absl::StatusOr<std::string> LoadCompareAndDelete(redisContext* c) {
  auto sha = Command(c, {"SCRIPT", "LOAD", kCompareAndDelete});
  if (!sha.ok()) return sha.status();
  if ((*sha)->type != REDIS_REPLY_STRING) return absl::InternalError("redis: SCRIPT LOAD gave no sha");
  return std::string((*sha)->str, (*sha)->len);
}

// --- etcd ------------------------------------------------------------------------------------

class EtcdCycler : public Cycler {
 public:
  EtcdCycler(std::unique_ptr<server::EtcdClient> etcd, int64_t lease, int client)
      : etcd_(std::move(etcd)), lease_(lease), key_(absl::StrCat("bench/lock/", client)) {}
  ~EtcdCycler() override { (void)etcd_->LeaseRevoke(lease_); }

  absl::StatusOr<int64_t> Cycle() override {
    const MonoTime start = Now();
    etcdserverpb::TxnRequest lock;
    etcdserverpb::Compare* absent = lock.add_compare();
    absent->set_key(key_);
    absent->set_target(etcdserverpb::Compare::CREATE);
    absent->set_result(etcdserverpb::Compare::EQUAL);
    absent->set_create_revision(0);
    etcdserverpb::PutRequest* put = lock.add_success()->mutable_request_put();
    put->set_key(key_);
    put->set_lease(lease_);
    lock.add_failure()->mutable_request_range()->set_key(key_);
    auto locked = etcd_->Txn(lock);
    if (!locked.ok()) return locked.status();
    if (!locked->succeeded()) return absl::FailedPreconditionError(absl::StrCat("etcd: ", key_, " is held"));
    // The fencing token: the key's create revision, the revision of this transaction.
    if (locked->header().revision() <= token_) return absl::InternalError("etcd: the revision went back");
    token_ = locked->header().revision();
    const int64_t took = NanosSince(start);
    etcdserverpb::TxnRequest unlock;
    unlock.add_success()->mutable_request_delete_range()->set_key(key_);
    auto unlocked = etcd_->Txn(unlock);
    if (!unlocked.ok()) return unlocked.status();
    return took;
  }

 private:
  std::unique_ptr<server::EtcdClient> etcd_;
  const int64_t lease_;
  const std::string key_;
  int64_t token_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RedisPeer>> RedisPeer::Start(const std::string& binary,
                                                            const std::string& dir,
                                                            Persistence persistence) {
  std::filesystem::create_directories(dir);
  auto port = process::FreeLoopbackPort();
  if (!port.ok()) return port.status();
  std::vector<std::string> args = {"--bind", "127.0.0.1", "--port", absl::StrCat(*port),
                                   "--dir", dir, "--daemonize", "no", "--save", "",
                                   "--logfile", dir + "/redis.log", "--protected-mode", "yes"};
  if (persistence == Persistence::kAppendFsyncAlways) {
    args.insert(args.end(), {"--appendonly", "yes", "--appendfsync", "always"});
  } else {
    args.insert(args.end(), {"--appendonly", "no"});
  }
  auto child = process::Child::Spawn(binary, args, {.stdout_file = dir + "/redis.out",
                                                    .stderr_file = dir + "/redis.out"});
  if (!child.ok()) return child.status();
  auto peer = std::unique_ptr<RedisPeer>(new RedisPeer);
  peer->child_ = std::move(*child);
  peer->port_ = *port;
  // Up when it answers PING; it has 10 s.
  const MonoTime give_up = Now() + absl::Seconds(10);
  for (;;) {
    if (!peer->child_.running()) {
      return absl::UnavailableError(absl::StrCat("redis-server exited; see ", dir, "/redis.log"));
    }
    if (auto c = RedisConnect(*port); c.ok()) {
      if (auto pong = Command(c->get(), {"PING"}); pong.ok()) {
        auto info = Command(c->get(), {"INFO", "server"});
        if (info.ok() && (*info)->type == REDIS_REPLY_STRING) {
          for (absl::string_view line : absl::StrSplit(std::string((*info)->str, (*info)->len), "\r\n")) {
            if (absl::ConsumePrefix(&line, "redis_version:")) peer->version_ = std::string(line);
          }
        }
        break;
      }
    }
    if (Now() > give_up) {
      return absl::UnavailableError(absl::StrCat("redis-server did not answer within 10 s; see ",
                                                 dir, "/redis.log"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return peer;
}

RedisPeer::~RedisPeer() { (void)child_.Stop(); }

CyclerFactory RedisPeer::Cyclers(bool token) const {
  const int port = port_;
  return [port, token](int client) -> absl::StatusOr<std::unique_ptr<Cycler>> {
    auto c = RedisConnect(port);
    if (!c.ok()) return c.status();
    auto sha = LoadCompareAndDelete(c->get());
    if (!sha.ok()) return sha.status();
    return std::make_unique<RedisCycler>(std::move(*c), std::move(*sha), client, token);
  };
}

StreamCyclerFactory RedisPeer::StreamCyclers(bool pipelined) const {
  const int port = port_;
  return [port, pipelined](int client) -> absl::StatusOr<std::unique_ptr<StreamCycler>> {
    auto c = RedisConnect(port);
    if (!c.ok()) return c.status();
    auto sha = LoadCompareAndDelete(c->get());
    if (!sha.ok()) return sha.status();
    return std::make_unique<RedisStreamCycler>(std::move(*c), std::move(*sha), client, pipelined);
  };
}

absl::StatusOr<std::unique_ptr<EtcdPeer>> EtcdPeer::Start(const std::string& binary,
                                                          const std::string& dir) {
  std::filesystem::create_directories(dir + "/logs");
  auto cluster = payout::EtcdCluster::Start({.dir = dir, .etcd_binary = binary, .members = 1});
  if (!cluster.ok()) return cluster.status();
  auto peer = std::unique_ptr<EtcdPeer>(new EtcdPeer);
  peer->cluster_ = std::move(*cluster);
  peer->endpoint_ = peer->cluster_->endpoints();
  auto etcd = server::GrpcEtcdClient::Create({peer->endpoint_}, absl::Seconds(5));
  if (!etcd.ok()) return etcd.status();
  auto status = (*etcd)->MemberStatus(0);
  if (!status.ok()) return status.status();
  peer->version_ = status->version();
  return peer;
}

EtcdPeer::~EtcdPeer() = default;

CyclerFactory EtcdPeer::Cyclers() const {
  const std::string endpoint = endpoint_;
  return [endpoint](int client) -> absl::StatusOr<std::unique_ptr<Cycler>> {
    auto etcd = server::GrpcEtcdClient::Create({endpoint}, absl::Seconds(5));
    if (!etcd.ok()) return etcd.status();
    auto lease = (*etcd)->LeaseGrant(absl::Seconds(30));
    if (!lease.ok()) return lease.status();
    return std::make_unique<EtcdCycler>(std::move(*etcd), *lease, client);
  };
}

}  // namespace fencelock::bench
