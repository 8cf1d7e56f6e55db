#!/usr/bin/env python3
"""The web page in a real browser: headless Chromium (Debian's chromium + chromium-driver) driven
through ChromeDriver's W3C WebDriver HTTP API with nothing but the standard library (no npm, no
downloads at test time).

Against `strata serve` on the embedded default model it checks:
  1. the page loads with no console errors or CSP violations and requests nothing from another
     origin (it works with no network);
  2. a chat round trip: type, send, the reply streams into the conversation, copy works, a reply
     with thinking on shows its thinking folded, the conversation is kept in localStorage and is
     still listed after a reload;
  3. while a long reply streams, the heat map canvas changes (its pixels, read back from the
     canvas), the dashboard shows the running generation; a screenshot is saved; the stop button
     ends the reply and the server reports the generation cancelled.
With --scenario api-key, against `strata serve --api-key KEY` instead:
  4. the page first shows the key bar asking for the key (the server answered 401), and a chat
     sent without it shows the server's 401 message; a wrong key is reported as not accepted;
  5. with the key entered (and "remember" ticked) the bar goes, the dashboard streams, a bench
     plot (--plots) is shown and a chat round trip succeeds; after a reload the remembered key is used at once; "forget" removes it
     from localStorage and the next load asks again.
Where Chromium or ChromeDriver is absent it prints `SKIPPED: ...` and exits 77 (CTest: Skipped).
"""
import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

SKIP = 77


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebDriver:
    """A minimal W3C WebDriver client for ChromeDriver."""

    def __init__(self, base):
        self.base = base
        self.session = None

    def call(self, method, path, body=None, timeout=60):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read() or b"{}").get("value")
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"webdriver {method} {path}: {e.code} {e.read()[:600]!r}") from None

    def start(self, chromium, profile_dir, width, height):
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", f"--user-data-dir={profile_dir}",
                f"--window-size={width},{height}", "--hide-scrollbars"]
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
            "goog:loggingPrefs": {"browser": "ALL"}}}}
        value = self.call("POST", "/session", caps, timeout=120)
        self.session = value["sessionId"]

    def s(self, path):
        return f"/session/{self.session}{path}"

    def cdp(self, cmd, params=None):
        return self.call("POST", self.s("/goog/cdp/execute"), {"cmd": cmd, "params": params or {}})

    def go(self, url):
        self.call("POST", self.s("/url"), {"url": url})

    def js(self, script, *args):
        return self.call("POST", self.s("/execute/sync"), {"script": script, "args": list(args)})

    def find(self, css):
        value = self.call("POST", self.s("/element"), {"using": "css selector", "value": css})
        return next(iter(value.values()))

    def click(self, css):
        self.call("POST", self.s(f"/element/{self.find(css)}/click"), {})

    def type(self, css, text):
        self.call("POST", self.s(f"/element/{self.find(css)}/value"), {"text": text})

    def clear(self, css):
        self.call("POST", self.s(f"/element/{self.find(css)}/clear"), {})

    def screenshot(self, path):
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.call("GET", self.s("/screenshot"))))

    def wait(self, script, timeout, what, *args):
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = self.js(script, *args)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")

    def quit(self):
        if self.session:
            try:
                self.call("DELETE", self.s(""), timeout=20)
            except Exception:
                pass


def http_json(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


# Recorded before any page script runs: errors and CSP violations.
WATCH = """
window.__problems = [];
window.addEventListener('error', e => window.__problems.push('error: ' + e.message));
window.addEventListener('unhandledrejection', e => window.__problems.push('rejection: ' + e.reason));
document.addEventListener('securitypolicyviolation', e => window.__problems.push('csp: ' + e.violatedDirective + ' ' + e.blockedURI));
"""

HEAT_SIGNATURE = """
const c = document.getElementById('heat');
return c.toDataURL('image/png');
"""


def check_chat_and_dashboard(driver, origin, artifacts, started):
    """Steps 1-3 of the module docstring, on a server without an API key."""
    # 1. The page loads, draws the dashboard, and touches nothing but its own origin.
    driver.go(origin + "/")
    driver.wait("return window.strata && strata.dash && strata.dash.renders > 0", 20, "the first dashboard render")
    driver.wait("return document.getElementById('model-name').textContent.length > 0", 10, "the model name")
    foreign = driver.js("return performance.getEntriesByType('resource').map(e => e.name)"
                        ".filter(n => !n.startsWith(location.origin))")
    assert not foreign, f"requests to other origins: {foreign}"
    print(f"page loaded and drawn in {time.time() - started:.1f} s")

    # 2. A chat round trip.
    driver.click("#settings summary")
    driver.clear("#set-max-tokens")
    driver.type("#set-max-tokens", "12")
    driver.clear("#set-temperature")
    driver.type("#set-temperature", "0")  # greedy: the same replies every run
    driver.type("#prompt", "And God said")
    driver.click("#send")
    driver.wait("return !strata.chat.busy() && document.querySelector('#messages .msg.assistant .meta')", 60,
                "the first reply")
    reply = driver.js("const m = document.querySelectorAll('#messages .msg.assistant');"
                      "return m[m.length - 1].querySelector('.content').textContent")
    meta = driver.js("return document.querySelector('#messages .msg.assistant .meta').textContent")
    assert reply.strip(), "the reply is empty"
    assert "12 tokens" in meta and "length" in meta, f"unexpected reply meta: {meta!r}"
    stored = driver.js("return JSON.parse(localStorage.getItem('strata.conversations.v1'))")
    assert len(stored) == 1 and [m["role"] for m in stored[0]["messages"]] == ["user", "assistant"], stored
    assert stored[0]["messages"][1]["content"] == reply
    print(f"chat round trip: {reply!r} ({meta})")
    driver.click("#messages .msg.assistant .meta button")
    driver.wait("return document.querySelector('#messages .msg.assistant .meta button').textContent === 'copied'",
                5, "the copy button to copy")

    # Thinking on: the default model's reply lands in reasoning_content, shown folded.
    driver.click("#set-thinking")  # the settings are still unfolded
    driver.type("#prompt", "Why")
    driver.click("#send")
    driver.wait("return !strata.chat.busy() && document.querySelectorAll('#messages .msg.assistant').length === 2",
                60, "the thinking reply")
    folded = driver.js("const m = document.querySelectorAll('#messages .msg.assistant')[1];"
                       "const d = m.querySelector('details.thinking');"
                       "return d ? {open: d.open, text: d.querySelector('.reasoning').textContent} : null")
    assert folded and not folded["open"] and folded["text"].strip(), f"thinking not shown folded: {folded}"
    print(f"thinking shown folded ({len(folded['text'])} chars)")
    driver.go(origin + "/")
    driver.wait("return document.querySelectorAll('#conversation-list li').length === 1 && "
                "document.querySelectorAll('#messages .msg').length === 4", 10, "the conversation after a reload")
    assert driver.js("return document.querySelector('#conversation-list li span').textContent") == "And God said"

    # A request the server refuses: its message is shown, the chat goes on.
    driver.click("#settings summary")
    driver.clear("#set-max-tokens")
    driver.type("#set-max-tokens", "5000")
    driver.type("#prompt", "too long")
    driver.click("#send")
    error = driver.wait("const e = document.querySelector('#messages .msg.error');"
                        "return !strata.chat.busy() && e && e.textContent", 30, "the error message")
    assert "max_tokens" in error, error
    print(f"refused request shown: {error!r}")

    # 3. A long reply: the heat map moves while it streams; then stop.
    driver.clear("#set-max-tokens")
    driver.type("#set-max-tokens", "3000")
    driver.click("#set-ignore-eos")
    driver.type("#prompt", "NAME\n")
    driver.click("#send")
    driver.wait("return strata.dash.snapshot && strata.dash.snapshot.generation.running && "
                "strata.dash.snapshot.generation.completion_tokens > 0", 30, "the dashboard to show the reply")
    signatures = []
    events_before = driver.js("return strata.dash.events")
    deadline = time.time() + 3
    while time.time() < deadline:
        signatures.append(hashlib.sha256(driver.js(HEAT_SIGNATURE).encode()).hexdigest())
        time.sleep(0.2)
    events = driver.js("return strata.dash.events") - events_before
    distinct = len(set(signatures))
    assert distinct >= 3, f"the heat map changed {distinct - 1} times in 3 s ({events} snapshots)"
    streaming = driver.js("return document.querySelector('#messages .msg.streaming .content').textContent.length")
    assert streaming > 0, "no reply text while streaming"
    kpi = driver.js("return document.querySelector('#kpis').textContent")
    assert "running" in kpi, kpi
    shot = os.path.join(artifacts, "dashboard-during-reply.png")
    driver.screenshot(shot)
    print(f"heat map: {distinct} different pictures in 3 s while streaming ({events} snapshots); screenshot {shot}")
    driver.click("#stop")
    driver.wait("return !strata.chat.busy()", 20, "the stop button to end the reply")
    meta = driver.js("const m = document.querySelectorAll('#messages .msg.assistant .meta');"
                     "return m[m.length - 1].textContent")
    assert "stopped" in meta, meta
    deadline = time.time() + 10
    while http_json(origin + "/api/dashboard")["generation"]["finish_reason"] != "cancelled":
        assert time.time() < deadline, "the server did not report the stopped generation as cancelled"
        time.sleep(0.1)
    # The dashboard-only view, for a second picture.
    driver.click("#view-dash")
    driver.wait("return document.getElementById('chat').offsetParent === null", 5, "the dashboard view")
    time.sleep(0.5)
    driver.screenshot(os.path.join(artifacts, "dashboard-view.png"))

    problems = driver.js("return window.__problems")
    assert not problems, f"page problems: {problems}"
    print(f"stop: {meta!r}; server: cancelled; no console errors or CSP violations; "
          f"{time.time() - started:.1f} s in the browser")


def auth_bar(driver):
    """The key bar's message when it is shown, else None."""
    return driver.js("const bar = document.getElementById('auth');"
                     "return bar.hidden ? null : document.getElementById('auth-message').textContent")


def send_and_wait(driver, prompt, assistant_count, what):
    """Sends `prompt` and waits for the assistant message number `assistant_count` to finish; its text."""
    driver.type("#prompt", prompt)
    driver.click("#send")
    return driver.wait("const m = document.querySelectorAll('#messages .msg.assistant');"
                       "return !strata.chat.busy() && m.length === arguments[0] && "
                       "(m[m.length - 1].querySelector('.meta') || m[m.length - 1].classList.contains('error')) && "
                       "m[m.length - 1].textContent", 60, what, assistant_count)


def check_api_key(driver, origin, key, artifacts):
    """Steps 4-5 of the module docstring, on `strata serve --api-key KEY`."""
    # 4. Without a key: the bar asks for one, and the server's 401 reaches the chat.
    driver.go(origin + "/")
    message = driver.wait("const bar = document.getElementById('auth');"
                          "return !bar.hidden && document.getElementById('auth-message').textContent",
                          20, "the page to ask for the API key")
    assert "requires an API key" in message and "--api-key" in message, message
    driver.wait("return document.getElementById('live').textContent === 'API key needed'", 10,
                "the dashboard to say it needs the key")
    assert driver.js("return strata.dash.renders") == 0, "the dashboard drew without a key"
    driver.click("#settings summary")
    driver.clear("#set-max-tokens")
    driver.type("#set-max-tokens", "8")
    driver.clear("#set-temperature")
    driver.type("#set-temperature", "0")
    refused = send_and_wait(driver, "Hello", 1, "the refused chat")
    assert "no API key given" in refused, f"the chat did not show the 401: {refused!r}"
    print(f"without a key: {message!r}; chat: {refused!r}")

    driver.type("#api-key", "not-the-key")
    driver.click("#api-key-use")
    wrong = driver.wait("const t = document.getElementById('auth-message').textContent;"
                        "return t.includes('did not accept') && t", 20, "the wrong key to be refused")
    driver.screenshot(os.path.join(artifacts, "api-key-bar.png"))
    print(f"a wrong key: {wrong!r}")

    # 5. The key entered and remembered: the bar goes, the dashboard streams, the chat answers.
    driver.clear("#api-key")
    driver.type("#api-key", key)
    driver.click("#api-key-remember")
    driver.click("#api-key-use")
    driver.wait("return document.getElementById('auth').hidden && strata.dash.renders > 0", 20,
                "the dashboard with the key")
    driver.wait("return document.getElementById('model-name').textContent.length > 1", 10, "the model name")
    driver.wait("const img = document.querySelector('#plots img');"
                "return img && img.complete && img.naturalWidth === 40 && img.src.startsWith('data:image/svg+xml')",
                10, "the bench plot fetched with the key")
    reply = send_and_wait(driver, "And God said", 2, "the reply with the key")
    meta = driver.js("const m = document.querySelectorAll('#messages .msg.assistant');"
                     "return m[m.length - 1].querySelector('.meta').textContent")
    assert "8 tokens" in meta, f"the chat with the key did not answer: {reply!r} ({meta!r})"
    assert driver.js("return localStorage.getItem('strata.api_key.v1')") == key
    print(f"with the key: {meta!r}")

    # Reloaded: the remembered key is sent at once, so the bar never shows.
    driver.go(origin + "/")
    driver.wait("return strata.dash.renders > 0", 20, "the dashboard after a reload")
    assert auth_bar(driver) is None, f"the key bar showed with a remembered key: {auth_bar(driver)!r}"
    # Forgotten: gone from localStorage, and the next load asks again.
    driver.click("#key-button")
    driver.click("#api-key-forget")
    assert driver.js("return localStorage.getItem('strata.api_key.v1')") is None
    driver.go(origin + "/")
    message = driver.wait("const bar = document.getElementById('auth');"
                          "return !bar.hidden && document.getElementById('auth-message').textContent",
                          20, "the page to ask again after forget")
    assert "requires an API key" in message, message
    problems = driver.js("return window.__problems")
    assert not problems, f"page problems: {problems}"
    print("remembered across a reload, forgotten on request; no console errors or CSP violations")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--artifacts", required=True, help="folder for the screenshots")
    parser.add_argument("--chromium", default=os.environ.get("STRATA_CHROMIUM", "/usr/bin/chromium"))
    parser.add_argument("--chromedriver", default=os.environ.get("STRATA_CHROMEDRIVER", "/usr/bin/chromedriver"))
    parser.add_argument("--scenario", choices=["chat", "api-key"], default="chat",
                        help="chat: steps 1-3 of the docstring; api-key: steps 4-5 (serve --api-key)")
    args = parser.parse_args()

    for tool in (args.chromium, args.chromedriver):
        if not (os.path.isfile(tool) and os.access(tool, os.X_OK)):
            print(f"SKIPPED: {tool} not found; install Debian's chromium and chromium-driver "
                  "(scripts/install-deps.sh does)")
            return SKIP
    os.makedirs(args.artifacts, exist_ok=True)
    work = tempfile.mkdtemp(prefix="strata-browser-")
    server = driver_process = None
    driver = None
    try:
        key = f"strata-page-key-{os.getpid()}"
        serve_args = []
        if args.scenario == "api-key":
            # A plot too: the page fetches it with the key (an <img src> request could not).
            plots = os.path.join(work, "plots")
            os.makedirs(plots)
            with open(os.path.join(plots, "square.svg"), "w") as f:
                f.write('<svg xmlns="http://www.w3.org/2000/svg" width="40" height="30">'
                        '<rect width="40" height="30" fill="#4aa3ff"/></svg>')
            serve_args = ["--api-key", key, "--plots", plots]
        server = subprocess.Popen([args.binary, "serve", "--port", "0", "--quiet", *serve_args], stdout=subprocess.PIPE,
                                  stderr=open(os.path.join(work, "serve.err"), "w"), text=True)
        line = server.stdout.readline()
        match = re.search(r" on http://[^ ]*:(\d+) ", line)
        if not match:
            raise AssertionError(f"strata serve did not start: {line!r}")
        origin = f"http://127.0.0.1:{match.group(1)}"

        port = free_port()
        driver_process = subprocess.Popen([args.chromedriver, f"--port={port}"], stdout=subprocess.DEVNULL,
                                          stderr=open(os.path.join(work, "chromedriver.err"), "w"))
        driver = WebDriver(f"http://127.0.0.1:{port}")
        deadline = time.time() + 20
        while True:
            try:
                if driver.call("GET", "/status", timeout=2).get("ready"):
                    break
            except Exception:
                pass
            if time.time() > deadline:
                raise AssertionError("chromedriver did not become ready")
            time.sleep(0.1)
        started = time.time()
        driver.start(args.chromium, os.path.join(work, "profile"), 1600, 1000)
        driver.cdp("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH})

        if args.scenario == "api-key":
            check_api_key(driver, origin, key, args.artifacts)
        else:
            check_chat_and_dashboard(driver, origin, args.artifacts, started)
        print("1 passed, 0 failed")
        return 0
    finally:
        if driver:
            driver.quit()
        for process in (driver_process, server):
            if process and process.poll() is None:
                process.terminate()
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
