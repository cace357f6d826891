/* The shim's IPC socket, spoken to directly (CPU and GPU tests under the
 * shim): where an exporter listens, a connection to it, a lease taken the way
 * an importer takes one (src/peers/wire.rs), and a flood of such a
 * lease's connection. */
#ifndef SOMASHIM_SHIM_IPC_SOCKET_H
#define SOMASHIM_SHIM_IPC_SOCKET_H
#include <errno.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/time.h>
#include <unistd.h>
#include <cuda_runtime_api.h>
#include "check.h"

/* The messages' sizes (REQUEST_LEN, REPLY_LEN in src/peers/wire.rs): a
 * request is an op and a handle, a reply a status, the pool's id and data. */
#define SHIM_IPC_REQUEST_LEN (4 + 64)
#define SHIM_IPC_REPLY_LEN (4 + 8 + 64)
/* No exchange with an exporter may block a test for longer. */
#define SHIM_IPC_TIMEOUT_S 5

/* The directory of the shim's sockets, as the shim names it: SOMA_SOCKET_DIR, or
 * this user's in /tmp. */
static inline void shim_socket_dir(char *dir, size_t size) {
  const char *named = getenv("SOMA_SOCKET_DIR");
  if (named && *named) snprintf(dir, size, "%s", named);
  else snprintf(dir, size, "/tmp/somashim-%u", (unsigned)geteuid());
}

/* The exporter's socket, as the shim's handle names it (pid at byte 12,
 * endpoint at 16, little-endian; src/peers/server.rs). */
static inline void socket_path_of(const cudaIpcMemHandle_t *h, char *path, size_t size) {
  CHECK(memcmp(h->reserved, "SOMASHIM", 8) == 0); /* a handle of the shim's (src/core/shared_blocks.rs) */
  uint32_t pid;
  uint64_t endpoint;
  memcpy(&pid, h->reserved + 12, sizeof pid);
  memcpy(&endpoint, h->reserved + 16, sizeof endpoint);
  char dir[96];
  shim_socket_dir(dir, sizeof dir);
  snprintf(path, size, "%s/%u-%016llx", dir, pid, (unsigned long long)endpoint);
}

/* A connection to an exporter's socket, whose sends and receives give up
 * after SHIM_IPC_TIMEOUT_S. */
static inline int connect_to(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct timeval limit = {SHIM_IPC_TIMEOUT_S, 0};
  CHECK(fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit) == 0 &&
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit) == 0);
  struct sockaddr_un address;
  memset(&address, 0, sizeof address);
  address.sun_family = AF_UNIX;
  snprintf(address.sun_path, sizeof address.sun_path, "%s", path);
  CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&address, sizeof address) == 0);
  return fd;
}

/* A connection holding a lease on the handle's block (an open request,
 * granted; the pool descriptor that comes with it is closed). */
static inline int take_lease(const cudaIpcMemHandle_t *h) {
  char path[128];
  socket_path_of(h, path, sizeof path);
  int fd = connect_to(path);
  unsigned char request[SHIM_IPC_REQUEST_LEN] = {1}; /* open */
  memcpy(request + 4, h, sizeof *h);
  CHECK(send(fd, request, sizeof request, MSG_NOSIGNAL) == (ssize_t)sizeof request);
  unsigned char reply[SHIM_IPC_REPLY_LEN];
  uint64_t control[4];
  struct iovec iov = {reply, sizeof reply};
  struct msghdr message;
  memset(&message, 0, sizeof message);
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  CHECK(recvmsg(fd, &message, MSG_WAITALL | MSG_CMSG_CLOEXEC) == (ssize_t)sizeof reply);
  CHECK(memcmp(reply, "\0\0\0\0", 4) == 0); /* granted */
  struct cmsghdr *header = CMSG_FIRSTHDR(&message);
  int passed = header && header->cmsg_level == SOL_SOCKET && header->cmsg_type == SCM_RIGHTS;
  CHECK(passed && !(message.msg_flags & MSG_CTRUNC));
  if (passed) {
    int pool_fd;
    memcpy(&pool_fd, CMSG_DATA(header), sizeof pool_fd);
    close(pool_fd);
  }
  return fd;
}

/* Sends up to `bytes` of zeros (no request) on the connection: how many went,
 * and in `*ended` whether the exporter ended the lease (the sends then fail;
 * a send that times out, the exporter no longer reading, is not an end). */
static inline size_t flood_lease(int fd, size_t bytes, int *ended) {
  static char chunk[64 << 10];
  size_t sent = 0;
  *ended = 0;
  while (sent < bytes) {
    ssize_t n = send(fd, chunk, sizeof chunk, MSG_NOSIGNAL);
    if (n < 0) {
      *ended = errno == EPIPE || errno == ECONNRESET;
      break;
    }
    sent += (size_t)n;
  }
  return sent;
}
#endif
