#!/usr/bin/python3
"""obs_test.py — issue 17's observability checks on a real PP 2 cluster
(strata-coordinator + 2 strata-worker processes on stories260K, started and
always stopped by the test; tests/cluster/cluster_test.py's Cluster).

  obs_test.py MODE --coordinator BIN --worker BIN --shared DIR

MODE
  logs       every stderr line of the coordinator and the workers is logfmt
             (ts= level= tag=strata-coordinator|strata-worker ... msg=); one
             access line per HTTP request (method, route, status, bytes =
             the body bytes the client read, duration_ms, req = the response
             id), for a plain and a streamed completion, a probe, a scrape
             and an unknown path; worker lines carry the request id; with
             --log-level warn no info line is written; a bad --log-level
             exits 2
  routes     strata_requests_total{route,status} counts API requests by a
             fixed route set (an unknown path is "other"); probes and
             /metrics scrapes count only in strata_ops_requests_total
"""
import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
import cluster_test as ct  # noqa: E402  (Cluster, finish)
from harness import FAILS, check, sse_events  # noqa: E402

# ---------------------------------------------------------------- logfmt

_PAIR = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)=("(?:[^"\\]|\\.)*"|[^\s"=]*)(?: +|$)')
_ESC = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}


def parse_logfmt(line):
    """key=value pairs of one line (dict, in order), or None when the line is
    not logfmt."""
    out, pos = {}, 0
    while pos < len(line):
        m = _PAIR.match(line, pos)
        if not m or m.end() == pos:
            return None
        k, v = m.group(1), m.group(2)
        if v.startswith('"'):
            v = re.sub(r'\\(x[0-9a-f]{2}|.)',
                       lambda e: chr(int(e.group(1)[1:], 16)) if e.group(1)[0] == "x"
                       else _ESC.get(e.group(1), e.group(1)), v[1:-1])
        out[k] = v
        pos = m.end()
    return out


def log_records(path, tag):
    """The log records of a process's output file: (records, bad lines).
    Lines that are not log records (the daemons' stdout banners, sanitizer
    output) are skipped; a line that starts like one must parse."""
    recs, bad = [], []
    with open(path, errors="replace") as f:
        for line in f.read().splitlines():
            if not line.startswith("ts="):
                continue
            r = parse_logfmt(line)
            if (r is None or list(r)[:3] != ["ts", "level", "tag"] or r["tag"] != tag or
                    r["level"] not in ("error", "warn", "info", "debug") or "msg" not in r or
                    not re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", r["ts"])):
                bad.append(line)
            else:
                recs.append(r)
    return recs, bad


# ---------------------------------------------------------------- HTTP

def request(cl, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", cl.http_port, timeout=120)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def metrics_text(cl):
    st, b = request(cl, "GET", "/metrics")
    check(st == 200, "GET /metrics -> %d" % st)
    return b.decode()


def samples(text):
    """{(name, frozenset(labels.items())): value} of a text exposition."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
        if not m:
            continue
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out[(m.group(1), frozenset(labels.items()))] = float(m.group(4))
    return out


def value(s, name, **labels):
    return s.get((name, frozenset(labels.items())), 0.0)


def wait_log(path, pred, skip=0, timeout=10):
    """The coordinator's records after the first `skip`, once pred holds."""
    deadline = time.time() + timeout
    while True:
        recs = log_records(path, "strata-coordinator")[0][skip:]
        if pred(recs) or time.time() > deadline:
            return recs
        time.sleep(0.05)


def new_cluster(args, coord_args=()):
    return ct.Cluster(args, [{"tp": 1}, {"tp": 1}], coord_args=list(coord_args))


# ---------------------------------------------------------------- modes

def mode_logs(args):
    with open(os.path.join(args.shared, "reference", "stories260K-greedy.json")) as f:
        ref = json.load(f)[0]
    # A bad --log-level is refused before anything starts.
    r = subprocess.run([args.coordinator, "--config", "/nonexistent", "--log-level", "loud"],
                       capture_output=True, timeout=30)
    check(r.returncode == 2 and b"--log-level" in r.stderr,
          "coordinator --log-level loud -> exit %d %s" % (r.returncode, r.stderr[:200]))
    r = subprocess.run([args.worker, "--listen", "127.0.0.1:0", "--log-level", "loud"],
                       capture_output=True, timeout=30)
    check(r.returncode == 2 and b"--log-level" in r.stderr,
          "worker --log-level loud -> exit %d %s" % (r.returncode, r.stderr[:200]))

    cl = new_cluster(args)
    try:
        cl.start()
        # A marker: the loop answers it after start()'s probes are logged.
        check(request(cl, "GET", "/v1/models")[0] == 200, "/v1/models")
        recs = wait_log(cl.co_log, lambda rs: any(r.get("route") == "/v1/models" for r in rs))
        skip = [i for i, r in enumerate(recs) if r.get("route") == "/v1/models"][-1] + 1
        # 1. A plain completion: its access line.
        st, body = request(cl, "POST", "/v1/completions", json.dumps(
            {"prompt": ref["prompt"], "max_tokens": 16, "temperature": 0}).encode())
        check(st == 200, "completion -> %d" % st)
        rid = json.loads(body)["id"]
        # 2. A streamed one: bytes = what the client read (chunks decoded).
        c = http.client.HTTPConnection("127.0.0.1", cl.http_port, timeout=120)
        c.request("POST", "/v1/chat/completions", body=json.dumps(
            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "stream": True,
             "temperature": 0}).encode(), headers={"Content-Type": "application/json"})
        resp = c.getresponse()
        sbody = resp.read()
        c.close()
        sid = json.loads(sbody.split(b"\n")[0][len(b"data: "):])["id"]
        check(resp.status == 200 and sbody.endswith(b"data: [DONE]\n\n"),
              "stream -> %d, ends with [DONE]" % resp.status)
        # 3. A probe, a scrape, an unknown path, a wrong method.
        check(request(cl, "GET", "/health")[0] == 200, "/health 200")
        check(request(cl, "GET", "/metrics")[0] == 200, "/metrics 200")
        st_nf, b_nf = request(cl, "GET", "/no/such/path?x=1")
        check(st_nf == 404, "unknown path -> 404")
        st_405, b_405 = request(cl, "GET", "/v1/completions")
        check(st_405 == 405, "GET /v1/completions -> 405")

        recs = wait_log(cl.co_log, lambda rs: sum(r["msg"] == "access" for r in rs) >= 6, skip)
        acc = [r for r in recs if r["msg"] == "access"]
        check(len(acc) == 6, "6 access lines for 6 requests (got %d)" % len(acc))

        def one(pred, what):
            m = [r for r in acc if pred(r)]
            check(len(m) == 1, "one access line for %s (got %d: %s)" % (what, len(m), m))
            return m[0] if m else {}

        a = one(lambda r: r.get("req") == rid, "the completion " + rid)
        check(a.get("method") == "POST" and a.get("route") == "/v1/completions" and
              a.get("status") == "200" and a.get("bytes") == str(len(body)) and
              float(a.get("duration_ms", "-1")) > 0,
              "completion access line: %s (body %d bytes)" % (a, len(body)))
        a = one(lambda r: r.get("req") == sid, "the stream " + sid)
        check(a.get("method") == "POST" and a.get("route") == "/v1/chat/completions" and
              a.get("status") == "200" and a.get("bytes") == str(len(sbody)) and
              "aborted" not in a, "stream access line: %s (body %d bytes)" % (a, len(sbody)))
        a = one(lambda r: r.get("route") == "/health", "/health")
        check(a.get("method") == "GET" and a.get("status") == "200" and "req" not in a,
              "probe access line: %s" % a)
        one(lambda r: r.get("route") == "/metrics" and r.get("status") == "200", "/metrics")
        a = one(lambda r: r.get("route") == "other", "the unknown path")
        check(a.get("status") == "404" and a.get("bytes") == str(len(b_nf)),
              "unknown path access line: %s" % a)
        a = one(lambda r: r.get("status") == "405", "the 405")
        check(a.get("route") == "/v1/completions" and a.get("method") == "GET",
              "405 access line: %s" % a)
        fin = [r for r in recs if r["msg"] == "finished" and r.get("req") == rid]
        check(len(fin) == 1 and fin[0].get("completion_tokens") == "16" and
              fin[0].get("finish") == "length",
              "the finished line carries the id and the counts: %s" % fin)

        # A client that goes away mid-stream: aborted=1, status 200.
        s = http.client.HTTPConnection("127.0.0.1", cl.http_port, timeout=120)
        s.request("POST", "/v1/completions", body=json.dumps(
            {"prompt": ref["prompt"], "max_tokens": 400, "ignore_eos": True,
             "stream": True}).encode(), headers={"Content-Type": "application/json"})
        r = s.getresponse()
        first = next(sse_events(r))
        aid = first["id"]
        s.sock.close()
        s.close()
        recs = wait_log(cl.co_log, lambda rs: any(x["msg"] == "access" and x.get("req") == aid
                                                  for x in rs))
        a = [x for x in recs if x["msg"] == "access" and x.get("req") == aid]
        check(len(a) == 1 and a[0].get("aborted") == "1" and a[0].get("status") == "200" and
              int(a[0].get("bytes", "0")) > 0, "disconnected stream: %s" % a)

        ct.finish(cl)
        # Every line of every process is logfmt with its program's tag.
        recs, bad = log_records(cl.co_log, "strata-coordinator")
        check(not bad and len(recs) > 10, "coordinator: %d logfmt records, bad lines: %s"
              % (len(recs), bad[:3]))
        for i in range(2):
            wrecs, wbad = log_records(os.path.join(cl.tmp, "worker%d.log" % i), "strata-worker")
            check(not wbad and wrecs and all(r.get("node") == "w%d" % i for r in wrecs),
                  "worker %d: %d logfmt records with node=w%d, bad lines: %s"
                  % (i, len(wrecs), i, wbad[:3]))
            starts = [r for r in wrecs if r["msg"] == "seq starts"]
            check(any(r.get("req") == rid for r in starts) and
                  all(r.get("req") and r.get("batch") and r.get("seq") for r in starts),
                  "worker %d: 'seq starts' lines carry req, seq and batch (%d)" % (i, len(starts)))
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()

    # --log-level warn: no info record at all, so no access lines either.
    cl = new_cluster(args, ["--log-level", "warn"])
    try:
        cl.start()
        st, _ = request(cl, "POST", "/v1/completions", json.dumps(
            {"prompt": ref["prompt"], "max_tokens": 4}).encode())
        check(st == 200, "completion at --log-level warn -> %d" % st)
        ct.finish(cl)
        recs, bad = log_records(cl.co_log, "strata-coordinator")
        check(not bad and all(r["level"] in ("warn", "error") for r in recs),
              "--log-level warn: only warn/error records (%d records: %s)"
              % (len(recs), sorted(set(r["level"] for r in recs))))
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()


def mode_routes(args):
    cl = new_cluster(args)
    try:
        cl.start()
        before = samples(metrics_text(cl))
        for _ in range(3):
            check(request(cl, "GET", "/health")[0] == 200, "/health")
        for _ in range(2):
            metrics_text(cl)
        check(request(cl, "GET", "/v1/models")[0] == 200, "/v1/models")
        check(request(cl, "GET", "/nope/%2e%2e/x")[0] == 404, "unknown path")
        check(request(cl, "POST", "/v1/completions", b"{")[0] == 400, "bad body")
        after = samples(metrics_text(cl))

        def delta(name, **labels):
            return value(after, name, **labels) - value(before, name, **labels)

        check(delta("strata_requests_total", route="/v1/models", status="200") == 1,
              "one /v1/models request counted")
        check(delta("strata_requests_total", route="other", status="404") == 1,
              "the unknown path counted as route=other")
        check(delta("strata_requests_total", route="/v1/completions", status="400") == 1,
              "the bad body counted under /v1/completions 400")
        check(delta("strata_ops_requests_total", route="/health", status="200") == 3,
              "3 probes in strata_ops_requests_total")
        # The scrape before `after` and the 2 between; `after` itself is counted
        # when its answer is complete.
        check(delta("strata_ops_requests_total", route="/metrics", status="200") == 3,
              "3 scrapes in strata_ops_requests_total (%s)"
              % delta("strata_ops_requests_total", route="/metrics", status="200"))
        routes = set(dict(k[1]).get("route") for k in after if k[0] == "strata_requests_total")
        check(not (routes & {"/health", "/metrics", "/nope/%2e%2e/x", "/nope/../x"}),
              "no probe, scrape or raw path in strata_requests_total routes: %s" % sorted(routes))
        ct.finish(cl)
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--shared", default=os.environ.get("STRATA_SHARED", "../shared"))
    args = ap.parse_args()
    modes = {"logs": mode_logs, "routes": mode_routes}
    if args.mode not in modes:
        ap.error("unknown mode %s" % args.mode)
    modes[args.mode](args)
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
