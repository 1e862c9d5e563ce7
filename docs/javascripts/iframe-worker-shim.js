/* attnlab docs: search that works from a file:// copy of the site, with no network.
   Browsers refuse Web Workers on file:// pages, so Material's search worker cannot start there;
   Material's offline plugin fetches a polyfill for that (iframe-worker) from a CDN. This is the
   same idea, local: on file:// only, `Worker` runs its script in a hidden iframe and messages
   travel by events. Its name contains "iframe-worker", so the offline plugin adds no CDN copy. */
(function () {
  "use strict";
  if (location.protocol !== "file:" || typeof window === "undefined") return;

  function IframeWorker(url) {
    var worker = this, inbox = [], ready = false;
    var iframe = document.createElement("iframe");
    iframe.setAttribute("aria-hidden", "true");
    iframe.setAttribute("tabindex", "-1");
    iframe.style.display = "none";
    this.onmessage = null;
    this.onerror = null;
    this._listeners = { message: [], error: [] };
    function emit(type, event) {
      if (typeof worker["on" + type] === "function") worker["on" + type](event);
      worker._listeners[type].forEach(function (f) { f(event); });
    }
    this._deliver = function (data) {
      var w = iframe.contentWindow;
      w.dispatchEvent(new w.MessageEvent("message", { data: data }));
    };
    this.postMessage = function (data) {
      if (ready) worker._deliver(data);
      else inbox.push(data);
    };
    iframe.onload = function () {
      var w = iframe.contentWindow, doc = iframe.contentDocument;
      // inside the frame, the worker's own postMessage answers the page
      w.postMessage = function (data) {
        setTimeout(function () { emit("message", { data: data, target: worker }); }, 0);
      };
      w.importScripts = function () {
        if (arguments.length) throw new Error("importScripts is not available offline");
      };
      w.onerror = function (message) { emit("error", { message: message }); };
      var script = doc.createElement("script");
      script.src = new URL(url, location.href).href;
      script.onload = function () {
        ready = true;
        inbox.splice(0).forEach(function (data) { worker._deliver(data); });
      };
      script.onerror = function () { emit("error", { message: "cannot load " + url }); };
      doc.body.appendChild(script);
    };
    (document.body || document.documentElement).appendChild(iframe);
  }
  IframeWorker.prototype.addEventListener = function (type, f) {
    if (this._listeners[type]) this._listeners[type].push(f);
  };
  IframeWorker.prototype.removeEventListener = function (type, f) {
    var list = this._listeners[type] || [], at = list.indexOf(f);
    if (at >= 0) list.splice(at, 1);
  };
  IframeWorker.prototype.terminate = function () {};
  window.Worker = IframeWorker;
})();
