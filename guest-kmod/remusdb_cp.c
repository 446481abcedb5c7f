// SPDX-License-Identifier: GPL-2.0
/*
 * remusdb_cp: RemusDB commit protection inside the guest.
 *
 * Remus holds every packet the guest sends until the checkpoint that
 * covers it reaches the backup, so each round trip of a transaction
 * waits for a checkpoint.  Only one kind of output must wait: the
 * acknowledgement of a commit, because a client that saw it must never
 * lose the commit in a failover.  This module lets a database say which
 * output that is.  A protected TCP socket's packets carry a DSCP code
 * point (the "dscp" parameter) that the host's relay reads; everything
 * else may leave at once.
 *
 * The state of a socket is its DSCP itself: protect sets the code point,
 * deprotect clears it.  So the module keeps no per-socket state, a socket
 * that closes while protected leaves nothing behind, and unloading the
 * module with protected sockets open is safe (their packets stay marked,
 * which only makes the relay hold them: the conservative side).  The
 * price: a socket whose owner chose a DSCP of its own cannot be protected
 * (EBUSY), because the relay restores DSCP 0 when it releases a marked
 * packet.
 *
 * The options (remusdb_cp.h) are a private range at level IPPROTO_IP
 * registered with nf_register_sockopt(): ip_setsockopt() hands options it
 * does not know to netfilter, which calls us with the socket.  IPv6
 * sockets reach the same path at level IPPROTO_IP.  Netfilter checks no
 * capability there, so a socket's unprivileged owner may use them, and
 * only on its own sockets.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/ipv6.h>
#include <linux/kobject.h>
#include <linux/module.h>
#include <linux/netfilter.h>
#include <linux/sysfs.h>
#include <linux/uaccess.h>
#include <net/inet_ecn.h>
#include <net/inet_sock.h>
#include <net/ip.h>
#include <net/sock.h>

#include "remusdb_cp.h"

/* RFC 2474 pool 2 (xxxx11) is for experimental and local use. */
static unsigned int dscp = 47;
module_param(dscp, uint, 0444);
MODULE_PARM_DESC(dscp, "DSCP code point of protected sockets' packets (1-63, default 47)");

static atomic64_t protects, deprotects, refused;

static bool is_tcp(const struct sock *sk)
{
	return sk->sk_type == SOCK_STREAM && sk->sk_protocol == IPPROTO_TCP &&
	       (sk->sk_family == AF_INET || sk->sk_family == AF_INET6);
}

static u8 socket_dscp(const struct sock *sk)
{
	return inet_sk(sk)->tos >> 2;
}

/*
 * Sets the DSCP of every packet the socket sends from now on, keeping
 * the ECN bits.  IPv4 packets (including v4-mapped ones of an IPv6
 * socket) take the TOS, native IPv6 ones the traffic class.
 */
static void set_socket_dscp(struct sock *sk, u8 code)
{
	ip_sock_set_tos(sk, code << 2);
#if IS_ENABLED(CONFIG_IPV6)
	if (sk->sk_family == AF_INET6) {
		struct ipv6_pinfo *np = inet6_sk(sk);

		lock_sock(sk);
		np->tclass = (np->tclass & INET_ECN_MASK) | (code << 2);
		sk_dst_reset(sk);
		release_sock(sk);
	}
#endif
}

static int cp_protect(struct sock *sk)
{
	u8 now = socket_dscp(sk);

	if (now == dscp)
		return 0;
	if (now != 0) {
		/* The relay restores DSCP 0: an owner's own code point would be lost. */
		atomic64_inc(&refused);
		return -EBUSY;
	}
	set_socket_dscp(sk, dscp);
	atomic64_inc(&protects);
	return 0;
}

static int cp_deprotect(struct sock *sk)
{
	if (socket_dscp(sk) != dscp)
		return 0;
	set_socket_dscp(sk, 0);
	atomic64_inc(&deprotects);
	return 0;
}

static int cp_set(struct sock *sk, int optval, sockptr_t arg, unsigned int len)
{
	if (!is_tcp(sk)) {
		atomic64_inc(&refused);
		return -EOPNOTSUPP;
	}
	switch (optval) {
	case REMUSDB_CP_PROTECT:
		return cp_protect(sk);
	case REMUSDB_CP_DEPROTECT:
		return cp_deprotect(sk);
	default:
		return -ENOPROTOOPT;
	}
}

static int cp_get(struct sock *sk, int optval, void __user *user, int *len)
{
	int state;

	if (optval != REMUSDB_CP_STATE)
		return -ENOPROTOOPT;
	if (*len < (int)sizeof(state))
		return -EINVAL;
	state = is_tcp(sk) && socket_dscp(sk) == dscp;
	if (copy_to_user(user, &state, sizeof(state)))
		return -EFAULT;
	*len = sizeof(state);
	return 0;
}

static struct nf_sockopt_ops cp_sockopts = {
	.pf = PF_INET,
	.set_optmin = REMUSDB_CP_PROTECT,
	.set_optmax = REMUSDB_CP_DEPROTECT + 1,
	.set = cp_set,
	.get_optmin = REMUSDB_CP_STATE,
	.get_optmax = REMUSDB_CP_STATE + 1,
	.get = cp_get,
	.owner = THIS_MODULE,
};

/* /sys/kernel/remusdb_cp: the code point and the counters. */

static ssize_t dscp_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%u\n", dscp);
}

#define COUNTER_ATTR(name)							\
static ssize_t name##_show(struct kobject *kobj, struct kobj_attribute *attr,	\
			   char *buf)						\
{										\
	return sysfs_emit(buf, "%lld\n", (long long)atomic64_read(&name));	\
}										\
static struct kobj_attribute name##_attr = __ATTR_RO(name)

COUNTER_ATTR(protects);
COUNTER_ATTR(deprotects);
COUNTER_ATTR(refused);
static struct kobj_attribute dscp_attr = __ATTR_RO(dscp);

static struct attribute *cp_attrs[] = {
	&dscp_attr.attr,
	&protects_attr.attr,
	&deprotects_attr.attr,
	&refused_attr.attr,
	NULL,
};

static const struct attribute_group cp_attr_group = {
	.attrs = cp_attrs,
};

static struct kobject *cp_kobj;

static int __init remusdb_cp_init(void)
{
	int err;

	if (dscp < 1 || dscp > 63) {
		pr_err("dscp=%u: use a code point from 1 to 63\n", dscp);
		return -EINVAL;
	}
	cp_kobj = kobject_create_and_add("remusdb_cp", kernel_kobj);
	if (!cp_kobj)
		return -ENOMEM;
	err = sysfs_create_group(cp_kobj, &cp_attr_group);
	if (err)
		goto put_kobj;
	err = nf_register_sockopt(&cp_sockopts);
	if (err) {
		pr_err("cannot register socket options %d-%d: %d\n",
		       REMUSDB_CP_BASE, REMUSDB_CP_MAX - 1, err);
		goto put_kobj;
	}
	pr_info("commit protection ready: options %d-%d, DSCP %u\n",
		REMUSDB_CP_BASE, REMUSDB_CP_MAX - 1, dscp);
	return 0;

put_kobj:
	kobject_put(cp_kobj);
	return err;
}

static void __exit remusdb_cp_exit(void)
{
	nf_unregister_sockopt(&cp_sockopts);
	kobject_put(cp_kobj);
}

module_init(remusdb_cp_init);
module_exit(remusdb_cp_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("RemusDB commit protection: protected sockets mark their packets for the host relay");
