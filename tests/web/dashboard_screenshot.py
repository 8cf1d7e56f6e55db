#!/usr/bin/env python3
"""Takes a screenshot of the page while a reply streams, against a running `strata serve`.
How docs/serve-dashboard.png was made (docs/serve.md):

  strata synth --shape mid-qwen4exp --type q8_0 --expert-type iq2_xs --routing-skew 1 \
      --routing-correlation 0.9 --tokenizer tests/data/tokenizer /tmp/mid/mid.gguf
  strata pack /tmp/mid/mid.gguf
  strata bench experts -m /tmp/mid/mid.gguf -n 8 --repeats 1 --budgets 10%,25%,50%,100% \
      --svg /tmp/mid/plots/mid-budgets.svg
  strata serve -m /tmp/mid/mid.gguf --ram-budget 25% --plots /tmp/mid/plots --port 8080 &
  tests/web/dashboard_screenshot.py --url http://127.0.0.1:8080/ --out /tmp/shot.png
  pngquant --quality 60-85 -o docs/serve-dashboard.png /tmp/shot.png
  (docs/serve-dashboard-full.png: --view dash --height 1900)
"""
import argparse
import os
import sys
import tempfile
import time
import subprocess

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from browser_test import WebDriver, free_port  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--width", type=int, default=1440)
    parser.add_argument("--height", type=int, default=1000)
    parser.add_argument("--prompt", default="The experts of layer")
    parser.add_argument("--wait", type=float, default=8, help="seconds of streaming before the picture")
    parser.add_argument("--view", choices=["both", "chat", "dash"], default="both",
                        help="the tab to photograph (the reply is sent from the chat first)")
    args = parser.parse_args()
    port = free_port()
    chromedriver = subprocess.Popen(["/usr/bin/chromedriver", f"--port={port}"], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
    driver = WebDriver(f"http://127.0.0.1:{port}")
    try:
        for _ in range(100):
            try:
                if driver.call("GET", "/status", timeout=2).get("ready"):
                    break
            except Exception:
                time.sleep(0.1)
        driver.start("/usr/bin/chromium", tempfile.mkdtemp(prefix="strata-shot-"), args.width, args.height)
        driver.go(args.url)
        driver.wait("return window.strata && strata.dash && strata.dash.renders > 0", 30, "the dashboard")
        driver.click("#settings summary")
        driver.clear("#set-max-tokens")
        driver.type("#set-max-tokens", "2000")
        driver.click("#set-ignore-eos")
        driver.click("#settings summary")
        driver.type("#prompt", args.prompt)
        driver.click("#send")
        driver.wait("return strata.dash.snapshot.generation.running", 60, "the reply to start")
        if args.view != "both":
            driver.click(f"#view-{args.view}")
        time.sleep(args.wait)
        driver.screenshot(args.out)
        driver.js("document.getElementById('stop').click()")  # the button may be on a hidden tab
        driver.wait("return !strata.chat.busy()", 30, "the stop")
        print(f"wrote {args.out}")
    finally:
        driver.quit()
        chromedriver.terminate()


if __name__ == "__main__":
    main()
