/* listen_guard.h — quiet a UCX listener's socket before ucp_listener_destroy.
 *
 * UCX 1.13.1 (Debian 12) frees a listener while a TCP connection it accepted,
 * whose request it has not read yet, still points at it: when the request
 * comes, UCX's async thread calls ucp_cm_server_conn_request_cb with the freed
 * listener (a SEGV in a worker stopped while a coordinator connects to it).
 * So the transport, before destroying its listener, stops the kernel from
 * completing new connections to it (listen_guard_block), closes its peers,
 * then ends every connection the listener accepted and waits, bounded, until
 * none is left (listen_guard_end_accepted == 0): after that no request can
 * reach the listener. Both work on this process's own sockets, found in
 * /proc/self/fd by the listener's port: UCX does not hand out its sockets.
 */
#ifndef STRATA_IB_LISTEN_GUARD_H
#define STRATA_IB_LISTEN_GUARD_H

/* Attaches a drop-everything socket filter to this process's listening TCP
 * socket(s) on port: a connection attempt gets no answer (the client's SYN
 * is dropped; it is refused once the socket closes), connections already
 * accepted keep working. Returns how many listening sockets it blocked. */
int listen_guard_block(int port);

/* Shuts down the connections a listener on port accepted that are still open
 * (this process's connected TCP sockets whose local port is port): UCX's
 * thread then drops each, or first delivers a request that had fully come.
 * Returns how many there were plus those waiting in the listener's accept
 * queue; 0: no connection can deliver a request any more. */
int listen_guard_end_accepted(int port);

#endif
