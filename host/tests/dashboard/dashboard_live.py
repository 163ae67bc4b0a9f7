"""The dashboard in a real headless browser (Debian's Chromium, driven by Playwright) while a job
runs: a wrong key is refused, the tenant signs in, its job appears, the RL curve gains points as
steps finish, a rollout renders as a conversation, and the page is screenshotted."""

import os

from playwright.sync_api import sync_playwright

URL = os.environ["TINKER_BASE_URL"] + "/dashboard"
KEY = os.environ["TINKER_API_KEY"]
JOB = os.environ["JOB_ID"]
SHOT = os.environ["SCREENSHOT"]
CHROMIUM = os.environ.get("OPENTINKER_CHROMIUM", "/usr/bin/chromium")
WAIT = 240_000


def points(page, curve):
    return int(page.get_attribute(f"#{curve}", "data-points"))


with sync_playwright() as playwright:
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    page.goto(URL)
    page.fill("#key", "tml-not-a-key")
    page.click("#login-button")
    page.wait_for_function("() => document.getElementById('login-error').textContent.length > 0")
    assert "invalid API key" in page.text_content("#login-error"), page.text_content("#login-error")

    page.fill("#key", KEY)
    page.click("#login-button")
    page.wait_for_selector(f'tr.job[data-id="{JOB}"]', timeout=WAIT)
    assert page.text_content("#who") == "tenant alice", page.text_content("#who")

    # The curve gains points as steps finish (read live from the job's event stream).
    page.wait_for_function("() => Number(document.getElementById('rl-curve').dataset.points) >= 1", timeout=WAIT)
    first = points(page, "rl-curve")
    page.wait_for_function(
        f"() => Number(document.getElementById('rl-curve').dataset.points) > {max(first, 6)}",
        timeout=WAIT,
    )
    assert points(page, "sft-curve") > 0
    page.wait_for_function("() => Number(document.getElementById('eval-curve').dataset.points) >= 2", timeout=WAIT)

    # A rollout renders as a conversation, its text as text.
    page.wait_for_selector("#rollouts .conversation .message.role-assistant", timeout=WAIT)
    assert page.locator("#rollouts .conversation").count() >= 1
    user = page.text_content("#rollouts .conversation .message.role-user")
    assert user and len(user) > len("user"), user

    # Its share of the base's training shows.
    page.wait_for_function("() => document.getElementById('usage').textContent.includes('training')")
    assert "opentinker/tiny" in page.text_content("#usage")

    assert not errors, errors
    page.screenshot(path=SHOT, full_page=True)
    browser.close()
print("dashboard ok:", SHOT)
