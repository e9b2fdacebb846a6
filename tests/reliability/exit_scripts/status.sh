#!/bin/sh
# status.sh DIR CMD ...: run CMD and keep its exit status in DIR/<host>.<pid>.rc, so that a
# test sees every process's status, not only the launcher's (which reports the first
# failure at best, and nothing for a process it did not start). 134 = SIGABRT.
d=$1
shift
"$@"
rc=$?
echo "$rc $*" >"$d/$(hostname).$$.rc"
exit $rc
