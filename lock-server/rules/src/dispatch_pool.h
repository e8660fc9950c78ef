// The admission pools' requests, for Dispatch (dispatch.cc).
#ifndef FENCELOCK_LOCK_SERVER_DISPATCH_POOL_H_
#define FENCELOCK_LOCK_SERVER_DISPATCH_POOL_H_

#include "lock-server/dispatch.h"

namespace fencelock::server {

// False, with `resp` answered UNSUPPORTED_VERSION (a protocol error; the connection stays
// open), if `conn` negotiated a version older than `needed`, which `what` needs.
bool RequireVersion(const ConnectionState& conn, uint32_t needed, const char* what,
                    DispatchHost& host, wire::Response& resp);

// True for the Pool* request bodies (protocol version 2).
bool IsPoolRequest(const wire::Request& req);

// Answers one pool request into `resp` (request_id already set): refused with
// UNSUPPORTED_VERSION on a connection that negotiated version 1; otherwise checked against the
// permissions (operator: publish, recover, drain, stop; manage: a profile's requests; status:
// list, operator or manage) and applied to the service's pools as of `now`.
void DispatchPool(const wire::Request& req, ConnectionState& conn, DispatchHost& host,
                  MonoTime now, wire::Response& resp);

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_DISPATCH_POOL_H_
