#!/usr/bin/env python3
"""ctest report.chromium: `kubetrain report` renders the step-log fixture (tests/data/steps.jsonl)
and headless Chromium loads the page with networking off; the test fails on any console message
of level error, any uncaught exception, any network request besides the page itself, fewer than
four drawn plots, and on a missing chromium (scripts/install-deps.sh installs it: this is not a
skip). It also takes a full-page screenshot.

The browser is driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON
messages on fds 3 and 4, ended by NUL), so it needs no port, and runs inside `unshare -rn` (a
network namespace with no interfaces up) where that is allowed, with every host name mapped to
nothing in any case. Each run also checks the checker: a broken copy of the page (an external
image, an SVG attribute that does not parse, a script's console.error) must be caught, with
each of the three named.

Usage: chromium_test.py KUBETRAIN [--steps STEPS.JSONL] [--screenshot PNG] [--keep DIR]
"""
import argparse
import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "data", "steps.jsonl")


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


class DevTools:
    """A Chromium over --remote-debugging-pipe, one page target attached (flat sessions)."""

    def __init__(self, chromium, isolate, profile):
        cmd_read, self.cmd_write = os.pipe()  # we write commands, chromium reads fd 3
        self.event_read, event_write = os.pipe()  # chromium writes fd 4

        def child_fds():
            # Out of the way first (either may be 3 or 4 already), then onto 3 and 4, inheritable.
            high_read = fcntl.fcntl(cmd_read, fcntl.F_DUPFD_CLOEXEC, 10)
            high_write = fcntl.fcntl(event_write, fcntl.F_DUPFD_CLOEXEC, 10)
            os.dup2(high_read, 3)
            os.dup2(high_write, 4)

        argv = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
                "--remote-debugging-pipe", "--user-data-dir=" + profile, "--no-first-run",
                "--no-default-browser-check", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-extensions",
                "--host-resolver-rules=MAP * ~NOTFOUND", "--hide-scrollbars", "about:blank"]
        if isolate:
            argv = ["unshare", "-rn"] + argv
        self.log = tempfile.TemporaryFile()
        # os.pipe()'s descriptors are not inherited (PEP 446); the dup2'ed 3 and 4 are, and
        # close_fds would close them after preexec_fn.
        self.proc = subprocess.Popen(argv, close_fds=False, preexec_fn=child_fds,
                                     stdout=self.log, stderr=self.log)
        os.close(cmd_read)
        os.close(event_write)
        self.buffer = b""
        self.next_id = 0
        self.events = []
        self.session = None

    def _read_message(self, deadline):
        while b"\0" not in self.buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from chromium")
            ready, _, _ = select.select([self.event_read], [], [], 0.5)
            if ready:
                chunk = os.read(self.event_read, 1 << 20)
                if not chunk:
                    self.log.seek(0)
                    raise RuntimeError("chromium closed the pipe; its output:\n" +
                                       self.log.read().decode(errors="replace")[-3000:])
                self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method, params=None, session=True, timeout=30):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self.cmd_write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError("%s: %s" % (method, reply["error"]))
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method, timeout=30):
        deadline = time.monotonic() + timeout
        for i, e in enumerate(self.events):
            if e.get("method") == method:
                return e
        while True:
            e = self._read_message(deadline)
            self.events.append(e)
            if e.get("method") == method:
                return e

    def drain(self, seconds):
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._read_message(deadline))
        except TimeoutError:
            pass

    def attach_page(self):
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)
        self.session = self.send("Target.attachToTarget",
                                 {"targetId": target["targetId"], "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.send(domain + ".enable")

    def close(self):
        try:
            self.send("Browser.close", session=False, timeout=5)
        except Exception:  # noqa: BLE001 (it may close the pipe before it answers)
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.cmd_write)
        os.close(self.event_read)


def check_page(chromium, isolate, path, screenshot=None):
    """Loads file://PATH; returns (problems, facts) where problems are what a good page lacks."""
    url = "file://" + os.path.abspath(path)
    profile = tempfile.mkdtemp(prefix="kt-chromium-")
    browser = DevTools(chromium, isolate, profile)
    problems, facts = [], {}
    try:
        browser.attach_page()
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": 840, "height": 900, "deviceScaleFactor": 1, "mobile": False})
        browser.send("Page.navigate", {"url": url})
        browser.wait_for("Page.loadEventFired")
        browser.drain(1.0)  # late console messages and requests
        plots = browser.send("Runtime.evaluate", {"returnByValue": True, "expression": (
            "Array.from(document.querySelectorAll('svg')).map(s => {"
            " const b = s.getBoundingClientRect(); return [s.id, b.width, b.height]; })")})
        facts["plots"] = plots["result"]["value"]
        if screenshot:
            size = browser.send("Page.getLayoutMetrics")["cssContentSize"]
            browser.send("Emulation.setDeviceMetricsOverride",
                         {"width": 840, "height": int(size["height"]) + 16,
                          "deviceScaleFactor": 1, "mobile": False})
            shot = browser.send("Page.captureScreenshot", {"format": "png",
                                                           "captureBeyondViewport": True})
            with open(screenshot, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
        browser.drain(0.2)
    finally:
        browser.close()
        shutil.rmtree(profile, ignore_errors=True)

    for e in browser.events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            problems.append("console.%s: %s" % (params["type"], text))
        elif method == "Runtime.exceptionThrown":
            problems.append("exception: " + json.dumps(params["exceptionDetails"])[:300])
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            problems.append("console error (%s): %s" % (entry.get("source"), entry.get("text")))
        elif method == "Network.requestWillBeSent" and params["request"]["url"] != url:
            problems.append("network request: " + params["request"]["url"][:200])
    return problems, facts


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("kubetrain")
    parser.add_argument("--steps", default=FIXTURE, help="the step log (default: the fixture)")
    parser.add_argument("--screenshot", help="write a full-page PNG of the report here")
    parser.add_argument("--keep", help="render into this directory and keep it")
    args = parser.parse_args()
    started = time.monotonic()

    chromium = shutil.which("chromium")
    if not chromium:
        fail("chromium is not installed (scripts/install-deps.sh installs Debian's chromium)")
    isolate = subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0
    print("chromium: %s; network: %s" % (chromium, "none (unshare -rn), host names mapped to "
                                         "nothing" if isolate else "host names mapped to nothing "
                                         "(unshare -rn not allowed here)"))

    work = args.keep or tempfile.mkdtemp(prefix="kt-report-")
    try:
        run_dir = os.path.join(work, "tiny")
        os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
        shutil.copy(args.steps, os.path.join(run_dir, "checkpoints", "steps.jsonl"))

        # The subcommand: --help, an error, the report.
        helped = subprocess.run([args.kubetrain, "report", "--help"], capture_output=True, text=True)
        if helped.returncode != 0 or "run-dir" not in helped.stdout or "--output" not in helped.stdout:
            fail("kubetrain report --help: rc %d\n%s" % (helped.returncode, helped.stdout))
        missing = subprocess.run([args.kubetrain, "report", os.path.join(work, "nothing")],
                                 capture_output=True, text=True)
        if missing.returncode != 1 or "no such file or directory" not in missing.stderr:
            fail("kubetrain report of a missing directory: rc %d, %s" %
                 (missing.returncode, missing.stderr))
        made = subprocess.run([args.kubetrain, "report", run_dir], capture_output=True, text=True)
        report = os.path.join(run_dir, "report.html")
        if made.returncode != 0 or made.stdout.strip() != "report: " + report:
            fail("kubetrain report: rc %d\nstdout: %s\nstderr: %s" %
                 (made.returncode, made.stdout, made.stderr))
        if args.steps == FIXTURE and "a torn write followed by a complete record" not in made.stderr:
            fail("kubetrain report did not warn about the fixture's torn write: " + made.stderr)
        html = open(report, encoding="utf-8").read()
        for external in ("<script", "<link", "<img", "src=", "href=", "url(", "@import"):
            if external in html:
                fail("the report contains %r" % external)
        print("report: %d bytes" % len(html))

        problems, facts = check_page(chromium, isolate, report, args.screenshot)
        plots = facts.get("plots", [])
        print("plots drawn: " + ", ".join("%s %dx%d" % (p[0], p[1], p[2]) for p in plots))
        if problems:
            fail("the report in chromium:\n  " + "\n  ".join(problems))
        wanted = ["loss-plot", "tokens-plot", "phases-plot", "timeline-plot"]
        if [p[0] for p in plots] != wanted or any(p[1] < 700 or p[2] < 100 for p in plots):
            fail("expected the plots %s drawn at least 700x100, got %s" % (wanted, plots))
        if args.screenshot:
            print("screenshot: %s (%d bytes)" % (args.screenshot, os.path.getsize(args.screenshot)))

        # The checker must see each kind of problem: a broken copy of the same page.
        broken = os.path.join(work, "broken.html")
        with open(broken, "w", encoding="utf-8") as f:
            f.write(html.replace("</body>", '<img src="http://192.0.2.1/pixel.png" alt="">\n'
                                 '<svg><rect width="nan" height="1"/></svg>\n'
                                 '<script>console.error("negative control")</script>\n</body>'))
        problems, _ = check_page(chromium, isolate, broken)
        print("negative control caught:\n  " + "\n  ".join(problems))
        for needle in ("192.0.2.1/pixel.png", "negative control", "attribute width"):
            if not any(needle in p for p in problems):
                fail("the checker missed %r in the broken page (it caught: %s)" % (needle, problems))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("report.chromium: ok in %.1f s" % (time.monotonic() - started))


if __name__ == "__main__":
    main()
