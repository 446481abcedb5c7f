/* Pre-shared key loading and the HMAC-SHA256 challenge (repl_auth.h). */
#include "wire/repl_auth.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fs_util.h"

/*
 * Checks the opened file and reads it into buf; -1 with err filled.  A
 * result of cap means the file may be longer.
 */
static ssize_t read_key_file(int fd, const char *path, uint8_t *buf, size_t cap,
			     char *err, size_t errlen)
{
	struct stat st;

	if (fstat(fd, &st) < 0) {
		snprintf(err, errlen, "cannot stat %s: %s", path, strerror(errno));
		return -1;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "%s is not a regular file", path);
		return -1;
	}
	/* A key others can read is no secret: refuse it rather than warn. */
	if (st.st_mode & 077) {
		snprintf(err, errlen, "%s is accessible by group or others (mode %04o): "
			 "run chmod 600 %s", path, (unsigned)(st.st_mode & 07777), path);
		return -1;
	}
	ssize_t n = read_full(fd, buf, cap);
	if (n < 0)
		snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
	return n;
}

int repl_psk_load(const char *path, uint8_t *key, size_t *key_len, char *err,
		  size_t errlen)
{
	/* Room for the longest key, "\r\n", and one byte to see it is longer. */
	uint8_t buf[REPL_PSK_MAX + 3];
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	int rc = -1;

	if (fd < 0) {
		snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
		return -1;
	}
	ssize_t got = read_key_file(fd, path, buf, sizeof(buf), err, errlen);
	close(fd);
	if (got < 0)
		goto out;
	size_t n = (size_t)got;
	if (n > 0 && buf[n - 1] == '\n') {
		n--;
		if (n > 0 && buf[n - 1] == '\r')
			n--;
	}
	if (n > REPL_PSK_MAX) {
		snprintf(err, errlen, "the key in %s is longer than %d bytes", path,
			 REPL_PSK_MAX);
		goto out;
	}
	if (n < REPL_PSK_MIN) {
		snprintf(err, errlen, "the key in %s is %zu bytes; it needs at least %d "
			 "(e.g. head -c 32 /dev/urandom | base64 > %s; chmod 600 %s)",
			 path, n, REPL_PSK_MIN, path, path);
		goto out;
	}
	memcpy(key, buf, n);
	*key_len = n;
	rc = 0;
out:
	OPENSSL_cleanse(buf, sizeof(buf));
	return rc;
}

int repl_nonce_fill(uint8_t nonce[REPL_NONCE_SIZE])
{
	size_t got = 0;

	while (got < REPL_NONCE_SIZE) {
		ssize_t n = getrandom(nonce + got, REPL_NONCE_SIZE - got, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		got += (size_t)n;
	}
	return 0;
}

struct mac_part {
	const void *data;
	size_t len;
};

/* HMAC-SHA256 over the concatenation of parts, without copying them together. */
static int hmac_sha256_parts(const uint8_t *key, size_t key_len,
			     const struct mac_part *parts, size_t count,
			     uint8_t out[REPL_MAC_SIZE])
{
	EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
	EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
	OSSL_PARAM params[] = {
		OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
		OSSL_PARAM_construct_end(),
	};
	size_t out_len = 0;
	int ok = ctx && EVP_MAC_init(ctx, key, key_len, params);

	for (size_t i = 0; ok && i < count; i++)
		ok = EVP_MAC_update(ctx, parts[i].data, parts[i].len);
	ok = ok && EVP_MAC_final(ctx, out, &out_len, REPL_MAC_SIZE) &&
	     out_len == REPL_MAC_SIZE;
	EVP_MAC_CTX_free(ctx);
	EVP_MAC_free(mac);
	return ok ? 0 : -1;
}

int repl_hmac_sha256(const uint8_t *key, size_t key_len, const uint8_t *msg,
		     size_t msg_len, uint8_t out[REPL_MAC_SIZE])
{
	const struct mac_part part = { msg, msg_len };

	return hmac_sha256_parts(key, key_len, &part, 1, out);
}

/* HMAC over parts, or unpredictable garbage when OpenSSL fails. */
static int auth_mac_parts(const uint8_t *key, size_t key_len, const struct mac_part *parts,
			  size_t count, uint8_t out[REPL_MAC_SIZE])
{
	if (hmac_sha256_parts(key, key_len, parts, count, out) == 0)
		return 0;
	/* Unpredictable garbage: never equal to what the peer computes. */
	if (repl_nonce_fill(out) < 0)
		RAND_bytes(out, REPL_MAC_SIZE);
	return -1;
}

int repl_auth_mac(const uint8_t *key, size_t key_len, const char *label,
		  const uint8_t a[REPL_NONCE_SIZE], const uint8_t b[REPL_NONCE_SIZE],
		  uint8_t out[REPL_MAC_SIZE])
{
	const struct mac_part parts[] = {
		{ label, strlen(label) },
		{ a, REPL_NONCE_SIZE },
		{ b, REPL_NONCE_SIZE },
	};

	return auth_mac_parts(key, key_len, parts, 3, out);
}

int repl_auth_mac_bound(const uint8_t *key, size_t key_len, const char *label,
			const uint8_t a[REPL_NONCE_SIZE], const uint8_t b[REPL_NONCE_SIZE],
			uint16_t version, uint8_t out[REPL_MAC_SIZE])
{
	const uint8_t v[2] = { (uint8_t)(version >> 8), (uint8_t)version };
	const struct mac_part parts[] = {
		{ label, strlen(label) },
		{ a, REPL_NONCE_SIZE },
		{ b, REPL_NONCE_SIZE },
		{ v, sizeof(v) },
	};

	return auth_mac_parts(key, key_len, parts, 4, out);
}

bool repl_auth_check(const uint8_t expected[REPL_MAC_SIZE], const uint8_t got[REPL_MAC_SIZE])
{
	return CRYPTO_memcmp(expected, got, REPL_MAC_SIZE) == 0;
}
