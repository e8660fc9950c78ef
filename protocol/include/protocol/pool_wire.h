// The pool values of protocol/pool_view.h to and from their wire messages: lockd writes a
// status and reads a published profile with these, the client the other way round.
#ifndef FENCELOCK_PROTOCOL_POOL_WIRE_H_
#define FENCELOCK_PROTOCOL_POOL_WIRE_H_

#include "fencelock/wire.pb.h"
#include "protocol/pool_view.h"

namespace fencelock::protocol {

wire::PoolProfile ToWire(const PoolProfileDef& profile);
PoolProfileDef FromWire(const wire::PoolProfile& profile);

// Durations go as whole milliseconds (negative ones as 0); an expires_in on an active lease is
// not sent.
void ToWire(const PoolView& view, wire::PoolStatusReply* out);
PoolView FromWire(const wire::PoolStatusReply& reply);

}  // namespace fencelock::protocol

#endif  // FENCELOCK_PROTOCOL_POOL_WIRE_H_
