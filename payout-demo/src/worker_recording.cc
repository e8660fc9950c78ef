#include "worker_recording.h"

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace fencelock::payout {

void Recorder::Log(const std::string& line) {
  std::printf("%s %s\n", name_.c_str(), line.c_str());
  std::fflush(stdout);
}

void Recorder::Event(const char* event, int64_t id, uint64_t token, const std::string& detail) {
  Log(absl::StrCat(event, " ", PayoutKey(id), " token ", token, detail.empty() ? "" : " ",
                   detail));
}

void Recorder::Record(int64_t begin, const char* event, int64_t id, uint64_t token,
                      const std::string& detail) {
  history_->Append(begin, event, PayoutKey(id), token, detail);
}

void Recorder::Step(int64_t begin, const char* event, int64_t id, uint64_t token,
                    const std::string& detail) {
  Event(event, id, token, detail);
  Record(begin, event, id, token, detail);
}

void Recorder::Fenced(int64_t begin, const char* fence, int64_t id, uint64_t token,
                      const absl::Status& s) {
  if (s.code() == absl::StatusCode::kAborted) {
    Record(begin, "fenced", id, token, absl::StrCat(fence, " ", s.message()));
  }
}

absl::StatusOr<Payout> RecordedStore::Claim(int64_t id, uint64_t token) {
  const int64_t begin = history::NowNanos();
  auto before = store_->Claim(id, token, rec_->name());
  if (!before.ok()) {
    rec_->Event("claim-refused", id, token, std::string(before.status().message()));
    rec_->Fenced(begin, "store", id, token, before.status());
    return before;
  }
  rec_->Step(begin, "claimed", id, token, absl::StrCat("was ", PayoutStateName(before->state)));
  return before;
}

absl::Status RecordedStore::MarkSubmitted(int64_t id, uint64_t token) {
  const int64_t begin = history::NowNanos();
  absl::Status s = store_->MarkSubmitted(id, token);
  if (!s.ok()) {
    rec_->Event("submit-mark-refused", id, token, std::string(s.message()));
    rec_->Fenced(begin, "store", id, token, s);
    return s;
  }
  rec_->Record(begin, "marked-submitted", id, token);
  return s;
}

absl::Status RecordedStore::MarkPaid(int64_t id, uint64_t token, int64_t rail_txn) {
  const int64_t begin = history::NowNanos();
  absl::Status s = store_->MarkPaid(id, token, rail_txn);
  if (!s.ok()) {
    rec_->Event("paid-mark-refused", id, token, std::string(s.message()));
    rec_->Fenced(begin, "store", id, token, s);
    return s;
  }
  rec_->Step(begin, "paid", id, token, absl::StrCat("txn ", rail_txn));
  return s;
}

absl::StatusOr<RailReply> RecordedRail::Status(int64_t id, uint64_t token) {
  const int64_t begin = history::NowNanos();
  auto status =
      rail_->Call({.kind = RailRequest::Kind::kStatus, .payout = PayoutKey(id), .token = token});
  if (!status.ok()) return status;
  if (status->kind == RailReply::Kind::kFenced) {
    rec_->Record(begin, "fenced", id, token, absl::StrCat("rail highest ", status->highest));
    return status;
  }
  rec_->Record(begin, "status-asked", id, token, FormatRailReply(*status));
  if (status->kind == RailReply::Kind::kPaid) {
    rec_->Event("found-paid", id, token, absl::StrCat("txn ", status->txn));
  }
  return status;
}

absl::StatusOr<RailReply> RecordedRail::Submit(int64_t id, uint64_t token, int64_t amount_cents) {
  rec_->Event("submitting", id, token);
  const int64_t begin = history::NowNanos();
  auto reply = rail_->Call({.kind = RailRequest::Kind::kSubmit,
                            .payout = PayoutKey(id),
                            .token = token,
                            .amount_cents = amount_cents});
  if (!reply.ok()) {
    rec_->Event("submit-unknown", id, token, std::string(reply.status().message()));
    return reply;
  }
  switch (reply->kind) {
    case RailReply::Kind::kPaid:
      rec_->Step(begin, "submitted", id, token, absl::StrCat("txn ", reply->txn));
      break;
    case RailReply::Kind::kDuplicate:
      rec_->Event("duplicate", id, token, absl::StrCat("txn ", reply->txn));
      break;
    case RailReply::Kind::kFenced:
      rec_->Event("rail-fenced", id, token, absl::StrCat("highest ", reply->highest));
      rec_->Record(begin, "fenced", id, token, absl::StrCat("rail highest ", reply->highest));
      break;
    default:
      rec_->Event("rail-error", id, token, FormatRailReply(*reply));
  }
  return reply;
}

void RecordedChecks::CheckStillHeld(const LockHandle& lock) {
  if (!checks_off_) client_->checkStillHeld(lock);
}

void RecordedChecks::BeginIrreversibleStep(int64_t id, const LockHandle& lock,
                                           const StepCost& step) {
  const int64_t begin = history::NowNanos();
  if (!checks_off_) client_->beginIrreversibleStep(lock, step);
  rec_->Record(begin, "step-started", id, lock.token(), step.name);
}

}  // namespace fencelock::payout
