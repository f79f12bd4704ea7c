"""Throwaway Redis Sentinel and Redis Cluster setups on 127.0.0.1 (for the failover tests), built from
RedisServer processes without persistence."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import redis

from deploy.local.processes import free_port
from deploy.local.redis_server import RedisServer, auth, cmd, server_major, terminate, wait_until


def wait_caught_up(primary: RedisServer, within: float = 20.0) -> None:
    """Until every replica of `primary` has everything it had written when this was called."""
    with primary.client() as c:
        target = int(c.info("replication")["master_repl_offset"])

    def caught_up() -> bool:
        with primary.client() as c:
            info = c.info("replication")
        links = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return bool(links) and all(int(v["offset"]) >= target for v in links)

    wait_until(caught_up, within, f"the replicas of port {primary.port} caught up")


# A replica's first sync starts at once (the default waits 5 s for more replicas to join).
FAST_SYNC = ("--repl-diskless-sync-delay", "0")


def port_with_bus() -> int:
    """A free port whose Redis 6.2 cluster bus (port + 10000) is free too."""
    for _ in range(100):
        port = free_port()
        try:
            with socket.create_server(("127.0.0.1", port + 10000)):
                return port
        except OSError:
            continue
    raise RuntimeError("no free port p with p + 10000 free too")


class SentinelSetup:
    """A master, its replicas and three sentinels on 127.0.0.1, no persistence anywhere.

    Small `down_after_ms` / `failover_timeout_ms`, so that a killed master is replaced within a few
    seconds. With a password, the data nodes require it, and so do the sentinels unless
    `sentinel_auth` is False (the sentinels always use it towards the data nodes).
    """

    def __init__(self, service: str = "mtsched", password: str | None = None, replicas: int = 1,
                 sentinels: int = 3, down_after_ms: int = 1000, failover_timeout_ms: int = 4000,
                 sentinel_auth: bool = True, binary: str | None = None):
        self.binary = binary or shutil.which("redis-server") or "redis-server"  # data nodes and sentinels
        self.service = service
        self.password = password
        self.sentinel_password = password if sentinel_auth else None
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.workdir = Path(tempfile.mkdtemp(prefix="mtsched-sentinel-"))
        self.data = [RedisServer(workdir=str(self.workdir / f"data-{i}"), password=password, args=FAST_SYNC,
                                 binary=self.binary) for i in range(1 + replicas)]
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.sentinel_procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        query = "?sentinel_password=" if self.password and not self.sentinel_password else ""
        return f"redis+sentinel://{auth(self.password)}{hosts}/{self.service}{query}"

    def sentinel_client(self, i: int = 0) -> redis.Redis:
        return redis.Redis(port=self.sentinel_ports[i], password=self.sentinel_password, socket_timeout=2,
                           socket_connect_timeout=2, decode_responses=True)

    def start(self) -> SentinelSetup:
        try:
            master = self.data[0].start()
            for r in self.data[1:]:
                r.args = [*FAST_SYNC, "--replicaof", "127.0.0.1", str(master.port)]
                r.start()
            self._wait_replicated(master, len(self.data) - 1)
            for i, port in enumerate(self.sentinel_ports):
                self.sentinel_procs.append(self._start_sentinel(i, port, master.port))
            # Failover needs a quorum of sentinels that know each other and the replicas (found
            # through the master's hello channel and INFO): wait for that before anyone kills it.
            want_others, want_replicas = len(self.sentinel_ports) - 1, len(self.data) - 1

            def sentinels_ready() -> bool:
                for i in range(len(self.sentinel_ports)):
                    with self.sentinel_client(i) as s:
                        state = s.sentinel_master(self.service)
                        if (int(state["num-other-sentinels"]) < want_others
                                or int(state["num-slaves"]) < want_replicas or int(state["port"]) != master.port):
                            return False
                return True

            wait_until(sentinels_ready, 30, "sentinels know each other and the replicas")
        except BaseException:
            self.cleanup()
            raise
        return self

    def _start_sentinel(self, i: int, port: int, master_port: int) -> subprocess.Popen[bytes]:
        d = self.workdir / f"sentinel-{i}"
        d.mkdir(parents=True, exist_ok=True)
        # Each sentinel is told its peers and the replicas up front (found by itself, that takes a
        # few hello/INFO periods); ids are fixed so that peers can be named.
        conf = [f"port {port}", "bind 127.0.0.1", "protected-mode no", f"dir {d}", f"sentinel myid {self._id(i)}",
                f"sentinel monitor {self.service} 127.0.0.1 {master_port} 2",
                f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
                f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {self.service} 1"]
        conf += [f"sentinel known-sentinel {self.service} 127.0.0.1 {p} {self._id(j)}"
                 for j, p in enumerate(self.sentinel_ports) if j != i]
        conf += [f"sentinel known-replica {self.service} 127.0.0.1 {r.port}" for r in self.data
                 if r.port != master_port]
        if self.password:
            conf.append(f"sentinel auth-pass {self.service} {self.password}")
        if self.sentinel_password:
            conf.append(f"requirepass {self.sentinel_password}")  # also what sentinels present to each other
        (d / "sentinel.conf").write_text("\n".join(conf) + "\n")  # sentinel rewrites it: a file of its own
        with open(d / "sentinel.log", "ab") as log:
            proc = subprocess.Popen([self.binary, str(d / "sentinel.conf"),
                                     "--sentinel"], stdout=log, stderr=subprocess.STDOUT)
        def answers() -> bool:
            with self.sentinel_client(i) as s:
                return bool(s.ping())

        wait_until(answers, 10, f"sentinel on port {port} answers")
        return proc

    @staticmethod
    def _id(i: int) -> str:
        return f"{i + 1:040x}"

    @staticmethod
    def _wait_replicated(master: RedisServer, replicas: int) -> None:
        def synced() -> bool:
            with master.client() as c:
                info = c.info("replication")
            links = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
            return len(links) >= replicas and all(v.get("state") == "online" for v in links)

        wait_until(synced, 20, f"{replicas} replica(s) of port {master.port} in sync")

    def master(self) -> RedisServer:
        """The data node the sentinels currently name as master."""
        with self.sentinel_client() as s:
            _host, port = cmd(s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        return next(r for r in self.data if r.port == int(port))

    def kill_master(self) -> RedisServer:
        """SIGKILL the current master; returns it (stopped)."""
        m = self.master()
        m.kill()
        return m

    def wait_failover(self, old: RedisServer, within: float = 30.0) -> RedisServer:
        """Until every sentinel names another node as master and that node says it is one."""
        def switched() -> bool:
            ports = set()
            for i in range(len(self.sentinel_ports)):
                with self.sentinel_client(i) as s:
                    ports.add(int(cmd(s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)[1]))
            if len(ports) != 1 or old.port in ports:
                return False
            new = next(r for r in self.data if r.port in ports)
            with new.client() as c:
                return bool(c.info("replication")["role"] == "master")

        wait_until(switched, within, f"failover away from port {old.port}")
        return self.master()

    def cleanup(self) -> None:
        for proc in self.sentinel_procs:
            terminate(proc, 5)
        self.sentinel_procs = []
        for r in self.data:
            r.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


class ClusterSetup:
    """A Redis Cluster on 127.0.0.1: `masters` primaries sharing the 16384 slots evenly, each with
    `replicas` replicas; no persistence (so a killed primary comes back empty, its slots and its
    cluster identity kept in nodes.conf).

    `cluster-require-full-coverage no`: while one primary is down, the others keep serving their
    slots (the default would stop the whole cluster).
    """

    SLOTS = 16384

    def __init__(self, masters: int = 3, replicas: int = 0, password: str | None = None,
                 node_timeout_ms: int = 1000, binary: str | None = None):
        self.workdir = Path(tempfile.mkdtemp(prefix="mtsched-cluster-"))
        self.password = password
        self.masters = masters
        self.nodes: list[RedisServer] = []
        # Redis 7 takes the bus port and slot ranges as options; 6.2 (`binary`, deploy/local/redis62.py) knows
        # neither: its bus is port + 10000 (port_with_bus: both free), and its slots are added one by one
        binary = binary or shutil.which("redis-server") or "redis-server"
        self.redis7 = server_major(binary) >= 7
        for i in range(masters * (1 + replicas)):
            # The bus port is given explicitly: the default (port + 10000) may not exist for a high free port.
            bus = ["--cluster-port", str(free_port())] if self.redis7 else []
            args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(node_timeout_ms), *bus,
                    "--cluster-require-full-coverage", "no", *FAST_SYNC]
            self.nodes.append(RedisServer(port=None if self.redis7 else port_with_bus(), password=password,
                                          workdir=str(self.workdir / f"node-{i}"), args=args, binary=binary))

    @property
    def url(self) -> str:
        return f"redis+cluster://{auth(self.password)}127.0.0.1:{self.nodes[0].port}"

    def start(self) -> ClusterSetup:
        try:
            for n in self.nodes:
                n.start()
            clients = [n.client() for n in self.nodes]
            try:
                for i, c in enumerate(clients):
                    cmd(c, "CLUSTER", "SET-CONFIG-EPOCH", i + 1)  # distinct epochs: no collisions
                per = self.SLOTS // self.masters
                for i, c in enumerate(clients[:self.masters]):
                    last = self.SLOTS - 1 if i == self.masters - 1 else (i + 1) * per - 1
                    if self.redis7:
                        cmd(c, "CLUSTER", "ADDSLOTSRANGE", i * per, last)
                    else:
                        cmd(c, "CLUSTER", "ADDSLOTS", *range(i * per, last + 1))
                for n in self.nodes[1:]:
                    cmd(clients[0], "CLUSTER", "MEET", "127.0.0.1", n.port, self._bus_port(n))
                ids = [str(cmd(c, "CLUSTER", "MYID")) for c in clients]
                for i, c in enumerate(clients[self.masters:]):
                    master_id = ids[i % self.masters]

                    def knows(c: redis.Redis = c, m: str = master_id) -> bool:
                        return m in str(cmd(c, "CLUSTER", "NODES"))

                    wait_until(knows, 20, "replica knows its master")
                    cmd(c, "CLUSTER", "REPLICATE", master_id)
            finally:
                for c in clients:
                    c.close()
            self.wait_healthy()
        except BaseException:
            self.cleanup()
            raise
        return self

    def add_primary(self) -> RedisServer:
        """A new, empty primary joined to the cluster (it owns no slot until one is moved to it)."""
        model = self.nodes[0]
        args = list(model.args)
        if "--cluster-port" in args:
            args[args.index("--cluster-port") + 1] = str(free_port())
        node = RedisServer(port=None if self.redis7 else port_with_bus(), password=self.password,
                           workdir=str(self.workdir / f"node-{len(self.nodes)}"), args=args, binary=model.binary)
        node.start()
        self.nodes.append(node)
        with self.nodes[0].client() as c:
            cmd(c, "CLUSTER", "MEET", "127.0.0.1", node.port, self._bus_port(node))
        self.wait_healthy()
        return node

    def begin_move(self, key: str, target: RedisServer) -> int:
        """A live reshard's first step for `key`'s slot: IMPORTING on `target`, MIGRATING on its owner. Returns
        the slot; its keys then move with move_keys and the move ends with end_move."""
        source = self.owner_of(key)
        with source.client() as s, target.client() as t:
            slot = int(cmd(s, "CLUSTER", "KEYSLOT", key))
            cmd(t, "CLUSTER", "SETSLOT", slot, "IMPORTING", str(cmd(s, "CLUSTER", "MYID")))
            cmd(s, "CLUSTER", "SETSLOT", slot, "MIGRATING", str(cmd(t, "CLUSTER", "MYID")))
        return slot

    def move_keys(self, slot: int, target: RedisServer, count: int) -> int:
        """MIGRATE up to `count` keys of the slot from the server that has them to `target`; how many moved."""
        source = next((n for n in self.nodes if n.running and n is not target and self._has_keys(n, slot)), None)
        if source is None:
            return 0
        with source.client() as s:
            keys = cmd(s, "CLUSTER", "GETKEYSINSLOT", slot, count)
            if keys:
                auth_args = ["AUTH", self.password] if self.password else []
                cmd(s, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, *auth_args, "KEYS", *keys)
        return len(keys)

    def end_move(self, slot: int, target: RedisServer) -> None:
        """The move's last step: every key moved, the slot given to `target` on every node."""
        while any(self._has_keys(n, slot) for n in self.nodes if n.running and n is not target):
            self.move_keys(slot, target, 100)
        with target.client() as t:
            target_id = str(cmd(t, "CLUSTER", "MYID"))
        for n in [target, *(n for n in self.nodes if n.running and n is not target)]:
            with n.client() as c:
                cmd(c, "CLUSTER", "SETSLOT", slot, "NODE", target_id)

    @staticmethod
    def _has_keys(n: RedisServer, slot: int) -> bool:
        with n.client() as c:
            return int(cmd(c, "CLUSTER", "COUNTKEYSINSLOT", slot)) > 0

    @staticmethod
    def _bus_port(n: RedisServer) -> int:
        return int(n.args[n.args.index("--cluster-port") + 1]) if "--cluster-port" in n.args else n.port + 10000

    def view(self, node: RedisServer) -> list[dict[str, str]]:
        """CLUSTER NODES as `node` sees it: one dict per node (port, id, flags, master id, link, slots)."""
        with node.client() as c:
            text = cmd(c, "CLUSTER", "NODES")
        out = []
        for line in str(text).splitlines():
            f = line.split()
            out.append({"id": f[0], "port": f[1].split("@")[0].rsplit(":", 1)[1], "flags": f[2], "master": f[3],
                        "link": f[7], "slots": " ".join(f[8:])})
        return out

    def _info(self, node: RedisServer) -> dict[str, str]:
        with node.client() as c:
            text = str(cmd(c, "CLUSTER", "INFO"))
        return dict(line.strip().split(":", 1) for line in text.splitlines() if ":" in line)

    def _owners(self, node: RedisServer) -> list[tuple[str, str]]:
        """(slot ranges, port) of every primary serving slots, as `node` sees it."""
        return sorted((v["slots"], v["port"]) for v in self.view(node)
                      if "master" in v["flags"] and "fail" not in v["flags"] and v["slots"])

    def wait_healthy(self, within: float = 30.0) -> None:
        """Until every node runs and sees all nodes connected, none failed, every slot served, and
        every replica's link to its primary up."""
        def healthy() -> bool:
            for n in self.nodes:
                info = self._info(n)
                if (info.get("cluster_state") != "ok" or int(info["cluster_slots_ok"]) != self.SLOTS
                        or int(info["cluster_known_nodes"]) != len(self.nodes)):
                    return False
                if any("fail" in v["flags"] or "handshake" in v["flags"] or v["link"] != "connected"
                       for v in self.view(n)):
                    return False
                with n.client() as c:
                    repl = c.info("replication")
                if repl["role"] == "slave" and repl.get("master_link_status") != "up":
                    return False
            return True

        wait_until(healthy, within, "cluster healthy")

    def owner_of(self, key: str) -> RedisServer:
        """The primary serving `key`'s slot now."""
        seen = next(n for n in self.nodes if n.running)
        with seen.client() as c:
            slot = int(cmd(c, "CLUSTER", "KEYSLOT", key))
        for ranges, port in self._owners(seen):
            for r in ranges.split():
                lo, _, hi = r.partition("-")
                if not r.startswith("[") and int(lo) <= slot <= int(hi or lo):  # "[...]": a slot in migration
                    return next(n for n in self.nodes if n.port == int(port))
        raise RuntimeError(f"no primary serves slot {slot}")

    def wait_failover(self, old: RedisServer, within: float = 30.0) -> None:
        """After the primary `old` was killed: until a replica serves its slots, as every running
        node agrees."""
        def settled() -> bool:
            running = [n for n in self.nodes if n.running]
            owners = [self._owners(n) for n in running]
            return (all(o == owners[0] for o in owners) and str(old.port) not in {p for _r, p in owners[0]}
                    and all(int(self._info(n)["cluster_slots_ok"]) == self.SLOTS for n in running))

        wait_until(settled, within, f"a replica took over the slots of port {old.port}")

    def restart(self, node: RedisServer) -> None:
        """Start a killed node again on its port: it rejoins from nodes.conf, with no data."""
        node.start()

    def cleanup(self) -> None:
        for n in self.nodes:
            n.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
