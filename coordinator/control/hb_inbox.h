/* hb_inbox.h — heartbeats answered on the rpc thread, applied on the loop's.
 *
 * A heartbeat is the one call that every node makes every interval; at a
 * thousand nodes, handing each one to the event loop (an eventfd wake, a
 * thread switch, and the reply's completion waking the rpc thread again) cost
 * more than the rest of the call. So the coordinator answers Heartbeat on the
 * rpc thread (node_rpc.c): the lease check is registry_lease_is (under
 * the registry's lock), and the heartbeat itself (time of arrival, load) goes
 * into this inbox. The loop's thread, which alone writes the rest of the
 * registry, applies the inbox in arrival order with registry_heartbeat: at
 * every tick (before the timeouts are checked, so a node is never judged on a
 * heartbeat still in the inbox) and before every call that shows node state.
 *
 * Ownership: the inbox's lock guards only its two buffers (the rpc thread
 * appends to one, the loop swaps them and applies the other). Nothing here
 * allocates once the buffers have grown to the largest batch between two
 * applies (a fleet's heartbeats per tick).
 * Errors: hb_inbox_put returns -1 when out of memory (the caller answers the
 * call RESOURCE_EXHAUSTED; the node's next heartbeat counts).
 */
#ifndef STRATA_COORDINATOR_HB_INBOX_H
#define STRATA_COORDINATOR_HB_INBOX_H

#include <stddef.h>
#include <stdint.h>

#include "coordinator/control/registry.h"

typedef struct hb_inbox hb_inbox;

hb_inbox *hb_inbox_new(void);
/* NULL is a no-op. */
void hb_inbox_free(hb_inbox *q);

/* Any thread: queues one heartbeat of node name (truncated to REG_NAME_MAX-1)
 * under lease, with its load (NULL: none) and its arrival (monotonic s). */
int hb_inbox_put(hb_inbox *q, const char *name, uint64_t lease, const reg_load *l, double now);

/* The registry's thread: applies every queued heartbeat in arrival order
 * (registry_heartbeat: a stale lease is ignored, as it would have been on
 * arrival). Returns how many were applied. */
size_t hb_inbox_apply(hb_inbox *q, registry *r);

/* Heartbeats queued and applied since creation (any thread). */
void hb_inbox_counts(hb_inbox *q, uint64_t *queued, uint64_t *applied);

#endif
