/* The relay between a guest NIC's stream socket and its tap (net_relay.h). */
#include "relay/net_relay.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/buffer.h"
#include "base/log.h"
#include "relay/net_frame.h"
#include "relay/tap.h"
#include "base/unix_socket.h"

/* QEMU may not be up yet, or is restarting: poll its socket at this pace. */
#define RECONNECT_DELAY_MS 200
/*
 * Encoded frames waiting for QEMU to read them.  If the guest stops
 * draining its NIC we drop (and count) rather than buffer without bound;
 * a real NIC drops too, and TCP in the guest copes.  1 MiB is ~690 full
 * 1514-byte frames.
 */
#define TO_GUEST_LIMIT (1024 * 1024)
/* Level-triggered: what is left is served next iteration, and no single
 * busy fd starves the others (NBD, QMP) meanwhile. */
#define READS_PER_WAKEUP 64
#define STREAM_READ_CHUNK (64 * 1024)

struct net_relay {
	event_loop *loop;
	char *vm_name;
	char *stream_socket;
	struct tap tap;
	int stream_fd;             /* -1 while not connected */
	long long reconnect_timer; /* 0 when none is armed */
	unsigned connect_failures; /* consecutive; an outage is logged once */
	struct buffer from_guest;  /* stream bytes not yet a whole frame */
	struct buffer to_guest;    /* encoded frames not yet sent to QEMU */
	/* The frame at the head of to_guest may be partly sent already. */
	uint32_t head_len;         /* its payload length */
	uint32_t head_unsent;      /* its bytes (header included) still queued */
	int to_guest_full_logged;
	int tap_write_failing;
	net_relay_output_hook output_hook; /* output commit; NULL = pass-through */
	void *output_hook_opaque;
	net_relay_output_hook input_hook;  /* the takeover's flow reset; NULL = pass-through */
	void *input_hook_opaque;
	/* A fork's clone starts with the parent's addresses: nothing of it
	 * may reach the LAN, nor the LAN it, until it has its own identity. */
	bool quarantined;
	/* While quarantined, the one identity let through (see the header). */
	bool admitted;
	uint8_t admitted_mac[6];
	uint8_t admitted_ip[4];
	struct net_relay_stats stats;
	uint8_t tap_frame[NET_FRAME_MAX_LEN];
};

static void try_connect(struct net_relay *relay);

static long reconnect_timer_fired(event_loop *loop, long long id, void *data)
{
	struct net_relay *relay = data;

	relay->reconnect_timer = 0;
	try_connect(relay);
	return TIMER_DONE;
}

static void schedule_reconnect(struct net_relay *relay)
{
	if (relay->reconnect_timer)
		return;
	long long id = event_loop_add_timer(relay->loop, RECONNECT_DELAY_MS,
					    reconnect_timer_fired, relay);
	if (id < 0) {
		log_error("vm %s: net: cannot arm reconnect timer; the guest NIC "
			  "stays disconnected", relay->vm_name);
		return;
	}
	relay->reconnect_timer = id;
}

/* Counts the frames still queued for QEMU as dropped. */
static void drop_queued_to_guest(struct net_relay *relay)
{
	size_t left = buffer_len(&relay->to_guest);
	uint64_t dropped = 0;
	struct net_frame frame;

	if (left == 0)
		return;
	const uint8_t *p = buffer_head(&relay->to_guest);
	if (relay->head_unsent > 0) {
		/* QEMU got the start of this one; it discards the rest too. */
		p += relay->head_unsent;
		left -= relay->head_unsent;
		dropped++;
	}
	while (net_frame_decode(p, left, &frame) == NET_FRAME_OK) {
		p += frame.consumed;
		left -= frame.consumed;
		dropped++;
	}
	if (dropped)
		log_info("vm %s: net: dropped %llu frame(s) queued for the guest",
			 relay->vm_name, (unsigned long long)dropped);
	relay->stats.frames_dropped += dropped;
	buffer_clear(&relay->to_guest);
	relay->head_unsent = 0;
	relay->head_len = 0;
	relay->to_guest_full_logged = 0;
}

static void disconnect(struct net_relay *relay, const char *why)
{
	size_t partial = buffer_len(&relay->from_guest);

	log_warn("vm %s: net: stream %s %s; reconnecting", relay->vm_name,
		 relay->stream_socket, why);
	if (partial) {
		log_warn("vm %s: net: dropped a partial frame from the guest "
			 "(%zu byte(s) received)", relay->vm_name, partial);
		relay->stats.frames_dropped++;
	}
	buffer_clear(&relay->from_guest);
	drop_queued_to_guest(relay);
	event_loop_unwatch(relay->loop, relay->stream_fd);
	close(relay->stream_fd);
	relay->stream_fd = -1;
	relay->stats.connected = 0;
	schedule_reconnect(relay);
}

/*
 * Every frame the guest sends passes through here, exactly once, in order.
 * This is where Remus' output buffering goes: instead of writing to the
 * tap, the frame will be appended to the current epoch's queue and
 * released only when the backup has acknowledged that epoch's checkpoint.
 * `frame` points into the stream buffer: copy it to keep it.
 */
/* Writes one guest frame to the tap (the LAN), counting it. */
static int send_to_lan(struct net_relay *relay, const uint8_t *frame, size_t len)
{
	ssize_t n;

	/*
	 * No loop on a short write: a tap write is one Ethernet frame,
	 * taken whole or not at all, so anything but len is an error.
	 */
	do {
		n = write(relay->tap.fd, frame, len);
	} while (n < 0 && errno == EINTR);
	if (n == (ssize_t)len) {
		relay->stats.frames_from_guest++;
		relay->stats.bytes_from_guest += len;
		relay->tap_write_failing = 0;
		return 0;
	}
	/* E.g. EIO while the tap is down: drop like a cable that is unplugged. */
	relay->stats.frames_dropped++;
	if (!relay->tap_write_failing)
		log_warn("vm %s: net: dropping guest frames, tap %s write: %s",
			 relay->vm_name, relay->tap.name,
			 n < 0 ? strerror(errno) : "short write");
	relay->tap_write_failing = 1;
	return -1;
}

int net_relay_send_to_lan(struct net_relay *relay, const uint8_t *frame, size_t len)
{
	return send_to_lan(relay, frame, len);
}

void net_relay_set_output_hook(struct net_relay *relay, net_relay_output_hook hook,
			       void *opaque)
{
	relay->output_hook = hook;
	relay->output_hook_opaque = opaque;
}

bool net_relay_output_hook_is(const struct net_relay *relay, net_relay_output_hook hook,
			      const void *opaque)
{
	return relay->output_hook == hook && relay->output_hook_opaque == opaque;
}

void net_relay_set_input_hook(struct net_relay *relay, net_relay_output_hook hook,
			      void *opaque)
{
	relay->input_hook = hook;
	relay->input_hook_opaque = opaque;
}

bool net_relay_input_hook_is(const struct net_relay *relay, net_relay_output_hook hook,
			     const void *opaque)
{
	return relay->input_hook == hook && relay->input_hook_opaque == opaque;
}

#define ETH_HEADER 14
#define ETHERTYPE_IPV4 0x0800
#define ETHERTYPE_ARP 0x0806

/*
 * A frame of the admitted identity: its source MAC, and for IPv4 its
 * source address, for ARP its sender address.  Everything else (the
 * parent's MAC or address, IPv6, VLAN tags) stays quarantined: a clone's
 * sockets of the parent's sessions may still send from the parent's
 * address after the guest changed its own.
 */
static bool from_admitted_identity(const struct net_relay *relay, const uint8_t *f,
				   uint32_t len)
{
	if (!relay->admitted || len < ETH_HEADER || memcmp(f + 6, relay->admitted_mac, 6))
		return false;
	uint16_t type = (uint16_t)(f[12] << 8 | f[13]);
	if (type == ETHERTYPE_IPV4)
		return len >= ETH_HEADER + 20 && !memcmp(f + 26, relay->admitted_ip, 4);
	if (type == ETHERTYPE_ARP)
		return len >= ETH_HEADER + 28 && !memcmp(f + 22, relay->admitted_mac, 6) &&
		       !memcmp(f + 28, relay->admitted_ip, 4);
	return false;
}

/* A LAN frame for the admitted identity: to its MAC, or broadcast/multicast. */
static bool to_admitted_identity(const struct net_relay *relay, const uint8_t *f,
				 uint32_t len)
{
	return relay->admitted && len >= ETH_HEADER &&
	       ((f[0] & 1) || !memcmp(f, relay->admitted_mac, 6));
}

/*
 * The one place a guest frame heads for the LAN.  While the VM is
 * protected the output hook takes it (Remus output commit: it is held
 * until its epoch is acknowledged); otherwise it goes out at once.
 */
static void relay_guest_frame(struct net_relay *relay, const uint8_t *frame,
			      uint32_t len)
{
	if (relay->quarantined && !from_admitted_identity(relay, frame, len)) {
		relay->stats.quarantine_dropped++;
		return;
	}
	if (relay->output_hook && relay->output_hook(relay->output_hook_opaque, frame, len))
		return;
	send_to_lan(relay, frame, len);
}

/* Returns -1 when the stream is out of sync and must be closed. */
static int decode_from_guest(struct net_relay *relay)
{
	struct net_frame frame;

	for (;;) {
		switch (net_frame_decode(buffer_head(&relay->from_guest),
					 buffer_len(&relay->from_guest), &frame)) {
		case NET_FRAME_OK:
			relay_guest_frame(relay, frame.payload, frame.len);
			buffer_consume(&relay->from_guest, frame.consumed);
			break;
		case NET_FRAME_NEED_MORE:
			return 0;
		case NET_FRAME_MALFORMED:
			log_error("vm %s: net: malformed frame from QEMU (%s: "
				  "length %u, maximum %u); closing the stream to "
				  "resynchronise", relay->vm_name, frame.error,
				  frame.len, NET_FRAME_MAX_LEN);
			/* Not a partial frame: nothing of it is worth keeping. */
			buffer_clear(&relay->from_guest);
			return -1;
		}
	}
}

/* Returns -1 if the stream was closed. */
static int read_from_guest(struct net_relay *relay)
{
	for (int i = 0; i < READS_PER_WAKEUP; i++) {
		ssize_t n = buffer_read_fd(&relay->from_guest, relay->stream_fd,
					   STREAM_READ_CHUNK);
		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			disconnect(relay, strerror(errno));
			return -1;
		}
		if (n == 0) {
			disconnect(relay, "closed by QEMU");
			return -1;
		}
		if (decode_from_guest(relay) < 0) {
			disconnect(relay, "closed after a framing error");
			return -1;
		}
	}
	return 0;
}

/* Consumes n sent bytes from to_guest, counting the frames completed. */
static void account_sent(struct net_relay *relay, size_t n)
{
	while (n > 0) {
		if (relay->head_unsent == 0) {
			struct net_frame frame;

			/* Only whole frames are queued, so this is OK. */
			net_frame_decode(buffer_head(&relay->to_guest),
					 buffer_len(&relay->to_guest), &frame);
			relay->head_len = frame.len;
			relay->head_unsent = NET_FRAME_HEADER_LEN + frame.len;
		}
		size_t step = n < relay->head_unsent ? n : relay->head_unsent;
		buffer_consume(&relay->to_guest, step);
		relay->head_unsent -= (uint32_t)step;
		n -= step;
		if (relay->head_unsent == 0) {
			relay->stats.frames_to_guest++;
			relay->stats.bytes_to_guest += relay->head_len;
		}
	}
}

/* Returns -1 if the stream was closed. */
static int flush_to_guest(struct net_relay *relay)
{
	while (buffer_len(&relay->to_guest) > 0) {
		/* MSG_NOSIGNAL: QEMU going away must not SIGPIPE the daemon. */
		ssize_t n = send(relay->stream_fd, buffer_head(&relay->to_guest),
				 buffer_len(&relay->to_guest),
				 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			disconnect(relay, strerror(errno));
			return -1;
		}
		account_sent(relay, (size_t)n);
	}
	if (buffer_len(&relay->to_guest) == 0)
		relay->to_guest_full_logged = 0;
	if (event_loop_set_mask(relay->loop, relay->stream_fd,
				EV_READABLE |
				(buffer_len(&relay->to_guest) ? EV_WRITABLE : 0)) < 0) {
		/* Unwatched, the queue would never drain: start over. */
		disconnect(relay, strerror(errno));
		return -1;
	}
	return 0;
}

/* A frame from the tap (the LAN) for the guest.  -1: dropped (counted). */
static int queue_to_guest(struct net_relay *relay, const uint8_t *frame,
			  uint32_t len)
{
	if (relay->stream_fd < 0) {
		relay->stats.frames_dropped++;
		return -1;
	}
	size_t encoded = NET_FRAME_HEADER_LEN + (size_t)len;
	if (buffer_len(&relay->to_guest) + encoded > TO_GUEST_LIMIT) {
		relay->stats.frames_dropped++;
		if (!relay->to_guest_full_logged)
			log_warn("vm %s: net: QEMU is not reading its NIC "
				 "stream; dropping frames for the guest",
				 relay->vm_name);
		relay->to_guest_full_logged = 1;
		return -1;
	}
	/* Header and payload in one reservation: to_guest holds whole frames only. */
	uint8_t *dst = buffer_reserve(&relay->to_guest, encoded);
	if (!dst) {
		relay->stats.frames_dropped++;
		return -1;
	}
	net_frame_encode_header(len, dst);
	memcpy(dst + NET_FRAME_HEADER_LEN, frame, len);
	buffer_commit(&relay->to_guest, encoded);
	return 0;
}

int net_relay_send_to_guest(struct net_relay *relay, const uint8_t *frame, size_t len)
{
	if (len > NET_FRAME_MAX_LEN || queue_to_guest(relay, frame, (uint32_t)len) < 0)
		return -1;
	return flush_to_guest(relay);
}

static void tap_handler(event_loop *loop, int fd, void *data, int ready)
{
	struct net_relay *relay = data;

	for (int i = 0; i < READS_PER_WAKEUP; i++) {
		ssize_t n = read(fd, relay->tap_frame, sizeof(relay->tap_frame));
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			/* Not transient (e.g. EBADFD): stop, or we would spin. */
			log_error("vm %s: net: tap %s read failed: %s; no more "
				  "frames to the guest", relay->vm_name,
				  relay->tap.name, strerror(errno));
			event_loop_unwatch(loop, fd);
			break;
		}
		if (n == 0)
			break;
		if (relay->quarantined &&
		    !to_admitted_identity(relay, relay->tap_frame, (uint32_t)n)) {
			relay->stats.quarantine_dropped++;
			continue;
		}
		if (relay->input_hook &&
		    relay->input_hook(relay->input_hook_opaque, relay->tap_frame, (uint32_t)n))
			continue;
		queue_to_guest(relay, relay->tap_frame, (uint32_t)n);
	}
	/* One send for the whole batch rather than one per frame. */
	if (relay->stream_fd >= 0 && buffer_len(&relay->to_guest) > 0)
		flush_to_guest(relay);
}

static void stream_handler(event_loop *loop, int fd, void *data, int ready)
{
	struct net_relay *relay = data;

	if ((ready & EV_WRITABLE) && flush_to_guest(relay) < 0)
		return;
	if (ready & EV_READABLE)
		read_from_guest(relay);
}

static void try_connect(struct net_relay *relay)
{
	int fd = unix_connect(relay->stream_socket);

	if (fd < 0) {
		if (relay->connect_failures++ == 0)
			log_info("vm %s: net: waiting for QEMU stream %s (%s)",
				 relay->vm_name, relay->stream_socket,
				 strerror(errno));
		schedule_reconnect(relay);
		return;
	}
	if (event_loop_watch(relay->loop, fd, EV_READABLE, stream_handler,
			     relay) < 0) {
		log_error("vm %s: net: cannot watch stream: %s", relay->vm_name,
			  strerror(errno));
		close(fd);
		schedule_reconnect(relay);
		return;
	}
	relay->stream_fd = fd;
	relay->connect_failures = 0;
	relay->stats.connected = 1;
	relay->stats.connects++;
	log_info("vm %s: net: connected to QEMU stream %s (tap %s)",
		 relay->vm_name, relay->stream_socket, relay->tap.name);
}

void net_relay_connect_now(struct net_relay *relay)
{
	if (relay->stream_fd >= 0)
		return;
	if (relay->reconnect_timer)
		event_loop_del_timer(relay->loop, relay->reconnect_timer);
	relay->reconnect_timer = 0;
	try_connect(relay);
}

struct net_relay *net_relay_create(event_loop *loop,
				   const struct net_relay_config *config)
{
	const char *vm = config->vm_name ? config->vm_name : "?";

	if (!config->stream_socket || !config->stream_socket[0] ||
	    !config->tap_name || !config->tap_name[0]) {
		log_error("vm %s: net: stream socket and tap name are required",
			  vm);
		return NULL;
	}
	if (strlen(config->stream_socket) >=
	    sizeof(((struct sockaddr_un *)0)->sun_path)) {
		log_error("vm %s: net: stream socket path too long: %s", vm,
			  config->stream_socket);
		return NULL;
	}
	struct net_relay *relay = calloc(1, sizeof(*relay));
	if (!relay) {
		log_error("vm %s: net: out of memory", vm);
		return NULL;
	}
	relay->loop = loop;
	relay->stream_fd = -1;
	relay->tap.fd = -1;
	buffer_init(&relay->from_guest);
	buffer_init(&relay->to_guest);
	relay->vm_name = strdup(vm);
	relay->stream_socket = strdup(config->stream_socket);
	if (!relay->vm_name || !relay->stream_socket) {
		log_error("vm %s: net: out of memory", vm);
		goto fail;
	}
	if (tap_create(&relay->tap, config->tap_name, config->bridge,
		       config->mtu) < 0)
		goto fail;
	if (event_loop_watch(loop, relay->tap.fd, EV_READABLE, tap_handler,
			     relay) < 0) {
		log_error("vm %s: net: cannot watch tap: %s", vm,
			  strerror(errno));
		goto fail;
	}
	try_connect(relay);
	return relay;
fail:
	net_relay_destroy(relay);
	return NULL;
}

void net_relay_destroy(struct net_relay *relay)
{
	if (!relay)
		return;
	if (relay->reconnect_timer)
		event_loop_del_timer(relay->loop, relay->reconnect_timer);
	if (relay->stream_fd >= 0) {
		event_loop_unwatch(relay->loop, relay->stream_fd);
		close(relay->stream_fd);
	}
	if (relay->tap.fd >= 0)
		event_loop_unwatch(relay->loop, relay->tap.fd);
	tap_destroy(&relay->tap);
	buffer_free(&relay->from_guest);
	buffer_free(&relay->to_guest);
	free(relay->vm_name);
	free(relay->stream_socket);
	free(relay);
}

void net_relay_get_stats(const struct net_relay *relay,
			 struct net_relay_stats *out)
{
	*out = relay->stats;
}

void net_relay_set_quarantine(struct net_relay *relay, bool on)
{
	if (relay->quarantined != on)
		log_info("vm %s: net: quarantine %s (%llu frames dropped so far)",
			 relay->vm_name, on ? "on: no frame passes either way" : "lifted",
			 (unsigned long long)relay->stats.quarantine_dropped);
	relay->quarantined = on;
	relay->admitted = false;
}

void net_relay_admit_identity(struct net_relay *relay, const uint8_t mac[6],
			      const uint8_t ipv4[4])
{
	memcpy(relay->admitted_mac, mac, 6);
	memcpy(relay->admitted_ip, ipv4, 4);
	relay->admitted = true;
	log_info("vm %s: net: quarantine lets through only %02x:%02x:%02x:%02x:%02x:%02x "
		 "at %u.%u.%u.%u", relay->vm_name, mac[0], mac[1], mac[2], mac[3], mac[4],
		 mac[5], ipv4[0], ipv4[1], ipv4[2], ipv4[3]);
}

const char *net_relay_quarantine_mode(const struct net_relay *relay)
{
	return !relay->quarantined ? "off" : relay->admitted ? "identity" : "all";
}

bool net_relay_quarantined(const struct net_relay *relay)
{
	return relay->quarantined;
}
