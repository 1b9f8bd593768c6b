"""Two hosts of one run on this machine, for the multi-host tests and benchmarks/hosts.py.

Each "host" gets a network namespace and a hostname of its own when this machine allows it (root
and iproute2); otherwise both run on the loopback under one hostname (hosts vm and vm-2). A host's
wall clock is moved by a small preload library built with the machine's C compiler: it shifts
CLOCK_REALTIME, gettimeofday and time, and nothing else (monotonic clocks, file times), as a host
whose clock is off would.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

USER_SCRIPT = Path(__file__).parent / "scripts" / "user_ddp.py"

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long long shift_ns(void) {
    const char *s = getenv("CLOCK_SHIFT_NS");
    return s ? atoll(s) : 0;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + shift_ns();
        ts->tv_sec = ns / 1000000000LL;
        ts->tv_nsec = ns % 1000000000LL;
    }
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (tv) { tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; }
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
"""


@dataclass
class Host:
    """How to start a command as one host: a command prefix, its address, its environment."""

    prefix: list[str]
    addr: str
    env: dict[str, str] = field(default_factory=dict)


@contextmanager
def two_hosts() -> Iterator[tuple[Host, Host, bool]]:
    """Hosts A and B: own network namespace and hostname each when possible; else both on the loopback.

    Yields (A, B, isolated). The namespaces are joined by a veth pair; each has an /etc/hosts of
    its own (``ip netns exec`` mounts /etc/netns/NAME/hosts) so torchrun resolves both names.
    DIAGTRAIN_TEST_LOOPBACK=1 asks for the loopback where namespaces would work.
    """
    tag = f"{os.getpid() % 1000}{uuid.uuid4().hex[:3]}"
    net = 10 + int(uuid.uuid4().hex[:2], 16) % 200
    names = [f"dt{tag}a", f"dt{tag}b"]
    addrs = [f"10.232.{net}.1", f"10.232.{net}.2"]
    made: list[str] = []

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)

    try:
        if not shutil.which("ip") or not shutil.which("unshare") or os.environ.get("DIAGTRAIN_TEST_LOOPBACK"):
            raise OSError("no iproute2 or util-linux here, or the loopback asked for")
        for name in names:
            ip("netns", "add", name)
            made.append(name)
        ip("link", "add", names[0], "type", "veth", "peer", "name", names[1])
        for name, addr in zip(names, addrs):
            ip("link", "set", name, "netns", name)
            ip("-n", name, "addr", "add", f"{addr}/24", "dev", name)
            ip("-n", name, "link", "set", name, "up")
            ip("-n", name, "link", "set", "lo", "up")
            Path(f"/etc/netns/{name}").mkdir(parents=True, exist_ok=True)
            Path(f"/etc/netns/{name}/hosts").write_text(
                f"127.0.0.1 localhost\n{addrs[0]} node-a\n{addrs[1]} node-b\n")
        isolated = True
    except (OSError, subprocess.SubprocessError):
        isolated = False
    try:
        if isolated:
            hosts = [Host(["ip", "netns", "exec", name, "unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"',
                           "sh"], addr, {"GLOO_SOCKET_IFNAME": name})
                     for name, addr, host in zip(names, addrs, ("node-a", "node-b"))]
        else:
            hosts = [Host([], "127.0.0.1"), Host([], "127.0.0.1")]
        yield hosts[0], hosts[1], isolated
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
            shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wrapper(host: Host, out: Path, endpoint: str, nproc: int, *options: str, after: float = 0.0) -> list[str]:
    """`diagtrain run` around torchrun --nnodes 2 for one host; ``after`` keeps its command alive longer."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--nproc-per-node={nproc}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=diagtrain-test",
                f"--local-addr={host.addr}", str(USER_SCRIPT)]
    if after:
        torchrun = ["sh", "-c", f'"$@"; code=$?; sleep {after}; exit $code', "sh", *torchrun]
    return [*host.prefix, sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), *options,
            "--", *torchrun]


def start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1", **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def host_names(out: Path) -> dict[str, list[int]]:
    manifest = json.loads((out / "manifest.json").read_text())
    return {h["name"]: h["ranks"] for h in manifest["hosts"]}




def build_shim(folder: Path) -> Path:
    """Compile SHIM into ``folder``; the library's path. Fails naming the missing compiler."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    assert compiler, "the multi-host tests build a clock shim: install a C compiler (apt-get install gcc)"
    (folder / "shift.c").write_text(SHIM)
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(folder / "shift.so"), str(folder / "shift.c"), "-ldl"],
                   check=True, capture_output=True, timeout=60)
    return folder / "shift.so"


def shifted(shim: Path, seconds: float) -> dict[str, str]:
    """The environment that moves a process tree's wall clock ``seconds`` ahead."""
    return {"LD_PRELOAD": str(shim), "CLOCK_SHIFT_NS": str(int(seconds * 1e9))}


def wrapper_host(out: Path, pid: int) -> str:
    """The host folder claimed by the wrapper with that pid."""
    for record in out.glob("hosts/*/host.json"):
        if json.loads(record.read_text())["process"]["pid"] == pid:
            return record.parent.name
    raise AssertionError(f"no host folder for wrapper {pid}")
