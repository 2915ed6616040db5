"""test_stratactl.py — stratactl (cli/) against ctl_test_server: tables and
--json output, placement set / auto, drain, streaming generate, and the
documented exit codes (0 ok, 1 server error, 2 usage, 3 unavailable/timeout).

usage: python3 test_stratactl.py SERVER_BIN STRATACTL_BIN
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rpc_fixture import Checker, TestServer, closed_port  # noqa: E402


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    server_bin, ctl = sys.argv[1:]
    t = Checker()

    def run(*args, addr=None):
        cmd = [ctl] + (["--addr", addr] if addr else []) + list(args)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return p.returncode, p.stdout, p.stderr

    with TestServer(server_bin, ["--node", "node-a", "--node", "node-b",
                                 "--gen-delay-ms", "2"]) as srv:
        a = srv.addr
        rc, out, err = run("status", addr=a)
        t.check(rc == 0 and "stories260K.gguf" in out and "0 ready / 2 total" in out,
                "status: %d %r %r" % (rc, out, err))

        rc, out, err = run("nodes", addr=a)
        lines = out.splitlines()
        t.check(rc == 0 and len(lines) == 3 and lines[0].startswith("NAME"),
                "nodes table: %r" % out)
        t.check(any(l.split()[:2] == ["node-a", "registered"] for l in lines[1:]),
                "node-a row: %r" % out)

        rc, out, err = run("--json", "nodes", addr=a)
        doc = json.loads(out) if rc == 0 else {}
        names = [n["name"] for n in doc.get("nodes", [])]
        t.check(names == ["node-a", "node-b"], "json nodes: %r" % names)
        if names:
            n0 = doc["nodes"][0]
            t.check(n0["state"] == "NODE_STATE_REGISTERED", "json state")
            t.check(n0["devices"] == [{"kind": "cpu", "count": 1, "memory_bytes": str(16 << 30), "gpus": []}],
                    "json devices: %r" % n0["devices"])
            t.check(n0["data_address"] == "127.0.0.1:7100", "json data address")

        rc, out, err = run("placement", "auto", addr=a)
        t.check(rc == 0 and "epoch 1" in out and "node-a" in out and "0-2" in out,
                "placement auto: %r" % out)
        rc, out, err = run("placement", "set", "--stages", "node-b:0-3,node-a:4", addr=a)
        t.check(rc == 0 and "epoch 2" in out, "placement set: %d %r %r" % (rc, out, err))
        rc, out, err = run("--json", "placement", "show", addr=a)
        cur = json.loads(out)["current"] if rc == 0 else {}
        stages = [(s["node"], s["first_layer"], s["last_layer"]) for s in cur.get("stages", [])]
        t.check(stages == [("node-b", 0, 3), ("node-a", 4, 4)] and cur.get("epoch") == "2",
                "json placement: %r" % stages)

        # Server errors: exit 1, the status code and the message on stderr.
        rc, out, err = run("placement", "set", "--stages", "node-a:0-2,node-x:3-4", addr=a)
        t.check(rc == 1 and "NOT_FOUND" in err and "node-x" in err,
                "unknown node: %d %r" % (rc, err))
        rc, out, err = run("placement", "set", "--stages", "node-a:0-2,node-b:2-4", addr=a)
        t.check(rc == 1 and "INVALID_ARGUMENT" in err and "covered twice" in err,
                "overlap: %d %r" % (rc, err))
        rc, out, err = run("--json", "placement", "show", addr=a)
        t.check(rc == 0 and json.loads(out)["current"]["epoch"] == "2",
                "placement unchanged after errors")
        rc, out, err = run("drain", "node-q", addr=a)
        t.check(rc == 1 and "NOT_FOUND" in err, "drain unknown: %d %r" % (rc, err))

        rc, out, err = run("drain", "node-b", addr=a)
        t.check(rc == 0 and out.strip() == "node-b: draining (placement epoch 2)",
                "drain: %r" % out)

        rc, out, err = run("generate", "once upon a time", "--max-tokens", "6", addr=a)
        t.check(rc == 0 and out == " t0 t1 t2 t3 t4 t5\n", "generate: %d %r" % (rc, out))
        rc, out, err = run("--json", "generate", "hi", "--max-tokens", "3", addr=a)
        chunks = [json.loads(l) for l in out.splitlines()] if rc == 0 else []
        t.check([c["token_ids"] for c in chunks] == [[100], [101], [102]],
                "json generate: %r" % out)
        t.check(bool(chunks) and chunks[-1]["finish_reason"] == "length", "json finish")

        # Timeout: a long stream under a 0.3 s deadline -> exit 3.
        rc, out, err = run("--timeout", "0.3", "generate", "x", "--max-tokens", "100000",
                           addr=a)
        t.check(rc == 3 and "DEADLINE_EXCEEDED" in err, "deadline: %d %r" % (rc, err))

        code = srv.stop()
        t.check(code == 0, "server exit status %s" % code)

    # Unavailable server -> 3.
    rc, out, err = run("status", addr="127.0.0.1:%d" % closed_port())
    t.check(rc == 3 and "UNAVAILABLE" in err, "unavailable: %d %r" % (rc, err))
    rc, out, err = run("nodes", addr="127.0.0.1:%d" % closed_port())
    t.check(rc == 3, "unavailable nodes: %d" % rc)

    # Usage errors -> 2, without contacting anything.
    for args in ([], ["bogus"], ["placement", "set"], ["placement", "move"],
                 ["placement", "set", "--stages", "node-a0-2"],
                 ["placement", "set", "--stages", "node-a:x-2"], ["drain"],
                 ["generate"], ["generate", "hi", "--max-tokens", "abc"],
                 ["--timeout", "-1", "status"], ["--frobnicate", "status"],
                 ["status", "extra"]):
        rc, out, err = run(*args, addr="127.0.0.1:%d" % closed_port())
        t.check(rc == 2 and "stratactl:" in err, "usage %r: %d %r" % (args, rc, err))
    rc, out, err = run("--help")
    t.check(rc == 0 and "exit codes" in out, "--help")
    return t.summary()


if __name__ == "__main__":
    sys.exit(main())
