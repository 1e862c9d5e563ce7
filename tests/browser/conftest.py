"""Headless Chromium (Debian's /usr/bin/chromium) driven by Playwright, for the page and the app.

These tests never skip: without chromium they fail and say how to install it (`make chromium`)."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-gpu",
        "--disable-component-update", "--no-first-run", "--disable-sync"]


@pytest.fixture(scope="session")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: the browser tests need Debian's chromium; run "
                    "`make chromium` as root (apt-get install -y chromium)", pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


class Watch:
    """Console errors, page errors, dialogs and every request a page makes; requests outside
    `allowed_origins` (plus data:/blob:) are aborted and recorded as `blocked`."""

    def __init__(self, page, allowed_origins):
        self.errors, self.dialogs, self.requests, self.blocked = [], [], [], []
        self.allowed = set(allowed_origins)
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("dialog", self._dialog)
        page.on("request", lambda r: self.requests.append(r.url))
        page.context.route("**/*", self._route)

    def _dialog(self, d):
        self.dialogs.append(d.message)
        d.dismiss()

    def _route(self, route):
        url = route.request.url
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        if parts.scheme in ("data", "blob") or origin in self.allowed or url in self.allowed:
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort()

    def outside(self):
        """Requests that went anywhere but the allowed origins (data:/blob: are local)."""
        out = []
        for u in self.requests:
            p = urlsplit(u)
            if p.scheme in ("data", "blob"):
                continue
            if f"{p.scheme}://{p.netloc}" not in self.allowed and u not in self.allowed:
                out.append(u)
        return out + self.blocked


@pytest.fixture
def open_page(browser):
    contexts = []

    def _open(url, allowed):
        ctx = browser.new_context(accept_downloads=True, viewport={"width": 1280, "height": 900})
        contexts.append(ctx)
        page = ctx.new_page()
        watch = Watch(page, allowed)
        page.goto(url)
        return page, watch

    yield _open
    for ctx in contexts:
        ctx.close()


@pytest.fixture
def clean_page(open_page):
    """open(url, *ready, allowed=None) -> page: `url` opened and waited on until every selector in
    `ready` is attached. When the test ends, each page opened must have logged no error, asked
    for nothing outside `allowed` (default: `url` itself) and opened no dialog. The page's
    Watch rides along as `page.attnlab_watch`, for a test that looks at it itself."""
    watches = []

    def _open(url, *ready, allowed=None):
        page, watch = open_page(url, allowed=[url] if allowed is None else allowed)
        for selector in ready:
            page.wait_for_selector(selector, state="attached")
        page.attnlab_watch = watch
        watches.append(watch)
        return page

    yield _open
    for watch in watches:
        assert watch.errors == [], watch.errors
        assert watch.outside() == [], watch.outside()  # nothing but what the page may reach
        assert watch.dialogs == [], watch.dialogs
