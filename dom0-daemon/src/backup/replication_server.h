/*
 * The backup side of Remus: remusdbd --listen ADDR:PORT accepts
 * authenticated primaries, keeps one replica per protected VM (the RAM
 * image and device state of the last committed epoch plus a disk
 * replica), acknowledges each epoch once it is committed, and takes over
 * when the primary dies: it wins the VM in etcd, starts an identical QEMU
 * with -incoming, feeds it the committed image, attaches the disk replica
 * and the NIC on this host's bridge, and announces the guest's MAC.
 */
#ifndef REMUSDB_REPLICATION_SERVER_H
#define REMUSDB_REPLICATION_SERVER_H

#include <jansson.h>

#include "base/event_loop.h"
#include "wire/repl_settings.h"
#include "vm/vm.h"

/*
 * At most this many connections may be waiting to authenticate: anyone
 * who can reach the port could otherwise hold every descriptor of the
 * daemon with idle connections.  More are closed at accept; each waits
 * at most the handshake timeout (5 s).
 */
#define REPL_MAX_UNAUTHENTICATED_SESSIONS 8

struct replication_server;

/* Listens on listen_addr ("ADDR:PORT").  NULL with a message in err. */
struct replication_server *replication_server_create(event_loop *loop,
						     const struct repl_settings *settings,
						     const char *listen_addr,
						     struct vm_registry *vms,
						     char *err, size_t errlen);
void replication_server_destroy(struct replication_server *server);
/*
 * The decoder of XOR_RLE/LZ4 pages (page_coding.h) for replicas created
 * from now on; borrowed.  page_decoder_default until set.
 */
struct page_decoder;
void replication_server_set_page_decoder(struct replication_server *server,
					 const struct page_decoder *decoder);
/* Manual takeover (`remusdb failover`).  0, or -1 with a message in err. */
/*
 * image-checksums: starts writing the XXH3-64 of every page of RAM block
 * `block` of the replica's committed image to path (replica_checksums.h);
 * its status shows under image_checksums.  0, or -1 with err set.
 */
int replication_server_image_checksums(struct replication_server *server, const char *vm,
				       const char *block, const char *path, char *err,
				       size_t errlen);
int replication_server_failover(struct replication_server *server, const char *vm,
				char *err, size_t errlen);
/*
 * Forks of a protected VM from its committed image (replica_fork.c,
 * vm_fork.h).  fork_start: 0, or -1 with a message in err (no such
 * replica, not READY, a fork already).  fork_release returns the fork's
 * last status (new reference), NULL when there is none.
 */
struct fork_settings;
struct vm_fork;
int replication_server_fork_start(struct replication_server *server, const char *vm,
				  const struct fork_settings *settings, unsigned clones,
				  unsigned push_mbps, char *err, size_t errlen);
struct vm_fork *replication_server_fork(const struct replication_server *server,
					const char *vm);
json_t *replication_server_fork_release(struct replication_server *server, const char *vm);
/*
 * `forget VM`: retires every idle replica of vm now (replica_retire.c).
 * The count, or -1 with why in err (none, or in use and why).
 */
int replication_server_forget(struct replication_server *server, const char *vm,
			      char *err, size_t errlen);
/* An array of replica status objects (new reference). */
json_t *replication_server_status_json(const struct replication_server *server);
/*
 * The replicas' memory on this host: the limit, what admission counted
 * for the replicas holding an image, the guest RAM they protect, and the
 * daemon's resident set beside it (per protected GiB).
 */
json_t *replication_server_memory_json(const struct replication_server *server);

#endif
