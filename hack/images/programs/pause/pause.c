/*
 * The pod sandbox's process: holds the pod's namespaces open and does nothing
 * else. It reaps children handed to it (as a pod's PID 1 may be) and exits on
 * SIGINT or SIGTERM, so the runtime can stop the sandbox at once.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
  (void)sig;
  _exit(0);
}

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && argv[1][0] == '-' && argv[1][1] == 'v') {
    puts("ambient-operator pause");
    return 0;
  }
  if (getpid() != 1) {
    fprintf(stderr, "pause: warning: not PID 1, children will not be reaped\n");
  }
  struct sigaction on_stop = {.sa_handler = stop};
  struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &on_stop, NULL) || sigaction(SIGTERM, &on_stop, NULL) ||
      sigaction(SIGCHLD, &on_child, NULL)) {
    perror("pause: sigaction");
    return 1;
  }
  for (;;) {
    pause();
  }
}
