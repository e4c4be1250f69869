// Follows a run's events live through the API's Server-Sent Events stream (no framework).
(function () {
  "use strict";
  var list = document.getElementById("events");
  if (!list) { return; }
  var source = new EventSource("/v1/runs/" + encodeURIComponent(list.dataset.run) + "/events");
  function show(kind, data) {
    var item = document.createElement("li");
    var detail = data.node_id ? " " + data.node_id : "";
    if (data.timeout_type) { detail += " (" + data.timeout_type + " bound)"; }
    item.textContent = data.at_epoch_ms + "  " + kind + detail;
    list.appendChild(item);
  }
  source.onmessage = function (e) { show("message", JSON.parse(e.data)); };
  ["run_started", "run_completed", "run_failed", "run_timed_out", "run_cancelled",
   "token_created", "token_dispatched", "token_executing", "token_completed", "token_failed",
   "token_timed_out", "token_cancelled", "token_pending", "token_waiting_for_siblings",
   "token_retry_scheduled", "join_decided", "join_timed_out", "late_result_discarded"
  ].forEach(function (kind) {
    source.addEventListener(kind, function (e) { show(kind, JSON.parse(e.data)); });
  });
  source.addEventListener("end", function () {
    source.close();
    list.dataset.live = "ended";
  });
})();
