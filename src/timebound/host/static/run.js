// Follows a run live through the API's Server-Sent Events stream (no framework): each event is
// appended to the list, and the rest of the page (status, bound fired, pending deadlines,
// actions, timeline, attempts) is fetched again and replaced, so nothing on it freezes.
(function () {
  "use strict";
  var list = document.getElementById("events");
  var live = document.getElementById("live");
  if (!list) { return; }
  var run = list.dataset.run;
  var source = new EventSource("/v1/runs/" + encodeURIComponent(run) + "/events");
  var pending = null;
  var inflight = false;
  var seen = 0;  // events received; the page shows the state after data-n of them
  function rendered() {
    var mark = document.getElementById("events-rendered");
    return mark ? Number(mark.dataset.n) : 0;
  }
  function refresh() {
    pending = null;
    if (!live || inflight) { schedule(); return; }
    // Not while the operator is typing a reason: the form would be replaced under them.
    if (live.contains(document.activeElement) && document.activeElement.tagName !== "BODY" &&
        document.activeElement.tagName !== "A") { schedule(); return; }
    inflight = true;
    fetch("/ui/runs/" + encodeURIComponent(run) + "?part=live", {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        inflight = false;
        if (html === null) { return; }
        live.innerHTML = html;
        if (seen > rendered()) { schedule(); }  // events that came while it was fetched
        if (window.timeboundTimes) { window.timeboundTimes(live); }
        live.dataset.refreshed = String(Number(live.dataset.refreshed || 0) + 1);
      })
      .catch(function () { inflight = false; });
  }
  function schedule() {
    if (pending === null) { pending = setTimeout(refresh, 250); }
  }
  function show(kind, data) {
    var item = document.createElement("li");
    var detail = data.node_id ? " " + data.node_id : "";
    if (data.branch_index !== undefined && data.branch_index !== null) {
      detail += "[" + data.branch_index + "]";
    }
    if (data.timeout_type) { detail += " (" + data.timeout_type + " bound)"; }
    if (data.reason && data.operator) { detail += " by " + data.operator + ": " + data.reason; }
    var at = document.createElement("time");
    at.dataset.ms = data.at_epoch_ms;
    at.title = "epoch ms " + data.at_epoch_ms;
    at.textContent = new Date(data.at_epoch_ms).toISOString();
    item.appendChild(at);
    item.appendChild(document.createTextNode("  " + kind + detail));
    list.appendChild(item);
    if (window.timeboundTimes) { window.timeboundTimes(item); }
    seen += 1;
    if (seen > rendered()) { schedule(); }
  }
  source.onmessage = function (e) { show("message", JSON.parse(e.data)); };
  ["run_started", "run_completed", "run_failed", "run_timed_out", "run_cancelled",
   "run_retried", "run_terminated", "deadline_extended", "token_redispatched",
   "token_created", "token_dispatched", "token_executing", "token_completed", "token_failed",
   "token_timed_out", "token_cancelled", "token_pending", "token_waiting_for_siblings",
   "token_retry_scheduled", "join_decided", "join_timed_out", "late_result_discarded"
  ].forEach(function (kind) {
    source.addEventListener(kind, function (e) { show(kind, JSON.parse(e.data)); });
  });
  source.addEventListener("end", function () {
    source.close();
    list.dataset.live = "ended";
    if (seen > rendered()) { schedule(); }
  });
})();
