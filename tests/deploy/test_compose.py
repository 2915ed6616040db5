#!/usr/bin/python3
"""test_compose.py SRC WORKER COORDINATOR — deploy/compose.yaml, parsed with
PyYAML and validated against what the binaries accept:

- a coordinator and at least two workers, built from deploy/Dockerfile;
- every worker reserves GPUs (driver nvidia, capability gpu), the reservations
  do not overlap, and it has what RDMA and NCCL need (memlock unlimited,
  IPC_LOCK, a large /dev/shm);
- every flag in a command is one the binary's --help lists; workers reach the
  coordinator by its service name at the coordinator's --grpc-listen port;
  each worker registers under its own name and presents that node's
  certificate (CN node:NAME, scripts/strata-ca's node-NAME.pem);
- every secret a service mounts is declared, and every /run/secrets path a
  command names is mounted in that service; every bind-mounted file exists in
  the repository (the TLS files and models are the operator's);
- the HTTP API is published on the host's loopback only;
- the Dockerfile builds the binaries the commands run and the CUDA module,
  and installs curl for the health checks.
`docker compose config` also runs where docker compose is installed (not here).
"""
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import FAILS, check  # noqa: E402

import yaml  # noqa: E402


def help_flags(binary):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", out.stdout + out.stderr))


def main():
    src, worker_bin, coord_bin = sys.argv[1:4]
    path = os.path.join(src, "deploy", "compose.yaml")
    with open(path) as f:
        doc = yaml.safe_load(f)
    check(isinstance(doc, dict) and isinstance(doc.get("services"), dict), "compose.yaml: a services map")
    services = doc["services"]
    secrets = doc.get("secrets") or {}
    flags = {"strata-worker": help_flags(worker_bin), "strata-coordinator": help_flags(coord_bin)}
    check(len(flags["strata-worker"]) > 10 and len(flags["strata-coordinator"]) > 10, "--help lists the flags")

    coord = services.get("coordinator")
    check(coord is not None, "a coordinator service")
    workers = {n: s for n, s in services.items() if s.get("command", [None])[0] == "strata-worker"}
    check(len(workers) >= 2, f"at least two workers ({sorted(workers)})")
    check(coord["command"][0] == "strata-coordinator", "the coordinator runs strata-coordinator")

    def arg(cmd, flag):
        check(flag in cmd, f"{cmd[0]} has {flag}")
        return cmd[cmd.index(flag) + 1]

    grpc_port = arg(coord["command"], "--grpc-listen").rsplit(":", 1)[1]
    check("--live" in coord["command"], "the coordinator runs in live mode")
    check(coord.get("ports") and all(str(p).startswith("127.0.0.1:") for p in coord["ports"]),
          f"the HTTP API is published on loopback only ({coord.get('ports')})")

    seen_gpus = {}
    names = set()
    for sname, svc in services.items():
        cmd = svc.get("command") or []
        check(svc.get("build", {}).get("dockerfile") == "deploy/Dockerfile" and svc.get("image"),
              f"{sname}: image built from deploy/Dockerfile")
        for tok in cmd[1:]:
            if isinstance(tok, str) and tok.startswith("--"):
                check(tok in flags[cmd[0]], f"{sname}: {cmd[0]} accepts {tok}")
        mounted = set(svc.get("secrets") or [])
        for s in mounted:
            check(s in secrets and os.path.isabs(os.path.join("/", secrets[s].get("file", ""))),
                  f"{sname}: secret {s} is declared")
        for tok in cmd:
            if isinstance(tok, str) and tok.startswith("/run/secrets/"):
                check(tok[len("/run/secrets/"):] in mounted, f"{sname}: {tok} is mounted")
        for v in svc.get("volumes") or []:
            host = v.split(":", 1)[0]
            if host.startswith("./") and not host.startswith("./compose/models") and "/tls/" not in host:
                check(os.path.exists(os.path.join(src, "deploy", host)), f"{sname}: {host} exists")
        hc = (svc.get("healthcheck") or {}).get("test") or []
        check(hc[:2] == ["CMD", "curl"], f"{sname}: a curl health check")

    for wname, w in workers.items():
        cmd = w["command"]
        name = arg(cmd, "--name")
        check(name not in names, f"{wname}: a name of its own ({name})")
        names.add(name)
        check(arg(cmd, "--coordinator") == f"coordinator:{grpc_port}", f"{wname}: dials coordinator:{grpc_port}")
        check(arg(cmd, "--grpc-cert") == f"/run/secrets/node-{name}.pem", f"{wname}: presents node-{name}.pem")
        check(arg(cmd, "--grpc-key") == f"/run/secrets/node-{name}.key", f"{wname}: its key")
        check(arg(cmd, "--cluster-key-file") == arg(coord["command"], "--cluster-key-file"),
              f"{wname}: the coordinator's cluster key")
        check("coordinator" in (w.get("depends_on") or {}), f"{wname}: starts after the coordinator")
        devs = w["deploy"]["resources"]["reservations"]["devices"]
        check(len(devs) >= 1, f"{wname}: a device reservation")
        for d in devs:
            check(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []), f"{wname}: nvidia gpu reservation")
            ids = d.get("device_ids") or []
            check(len(ids) >= 1 and all(isinstance(i, str) for i in ids), f"{wname}: device ids as strings {ids}")
            for i in ids:
                check(i not in seen_gpus, f"{wname}: GPU {i} not also reserved by {seen_gpus.get(i)}")
                seen_gpus[i] = wname
        check(w.get("ulimits", {}).get("memlock") == -1, f"{wname}: memlock unlimited (RDMA)")
        check("IPC_LOCK" in (w.get("cap_add") or []), f"{wname}: IPC_LOCK")
        shm = str(w.get("shm_size", ""))
        check(re.fullmatch(r"\d+gb", shm) is not None and int(shm[:-2]) >= 1, f"{wname}: shm_size >= 1gb ({shm})")

    with open(os.path.join(src, "deploy", "Dockerfile")) as f:
        df = f.read()
    check(re.search(r"^FROM ", df, re.M) is not None, "Dockerfile: a FROM line")
    check("scripts/bootstrap" in df and os.path.exists(os.path.join(src, "scripts", "bootstrap")),
          "Dockerfile: installs the packages with scripts/bootstrap")
    for b in ("strata-worker", "strata-coordinator", "strata-cuda"):
        check(b in df, f"Dockerfile: builds {b}")
    check("curl" in df, "Dockerfile: installs curl (health checks)")
    check("/usr/local/lib/strata" in df, "Dockerfile: the CUDA module where the registry looks (../lib/strata)")

    has_compose = shutil.which("docker") and subprocess.run(
        ["docker", "compose", "version"], capture_output=True).returncode == 0
    if has_compose:
        r = subprocess.run(["docker", "compose", "-f", path, "config", "-q"], capture_output=True, text=True)
        check(r.returncode == 0, f"docker compose config: {r.stderr.strip()}")
    else:
        print("docker compose not installed: docker compose config not run")
    if FAILS:
        print(f"test_compose: {len(FAILS)} check(s) failed")
        sys.exit(1)
    print("test_compose: all checks passed")


if __name__ == "__main__":
    main()
