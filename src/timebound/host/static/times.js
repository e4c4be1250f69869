// Instants as a person reads them (D8.22): each <time data-ms> shows the reader's local
// date-time and how long ago (or, with data-countdown, how long until), refreshed every second.
// The page's own text is ISO UTC, so the page reads correctly without this script.
(function () {
  "use strict";
  // Whole seconds in the one duration text of the Python side (D1.14): "45s", "3min 4s",
  // "2h 5min", "1d 1h" (format_duration in _core/_durations.py).
  function span(ms) {
    var s = Math.round(Math.abs(ms) / 1000);
    var parts = [];
    [["d", 86400], ["h", 3600], ["min", 60]].forEach(function (unit) {
      var count = Math.floor(s / unit[1]);
      s -= count * unit[1];
      if (count) { parts.push(count + unit[0]); }
    });
    if (s || !parts.length) { parts.push(s + "s"); }
    return parts.join(" ");
  }
  var format = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "short", day: "numeric",
    hour: "2-digit", minute: "2-digit", second: "2-digit"
  });
  function render(root) {
    var now = Date.now();
    (root || document).querySelectorAll("time[data-ms]").forEach(function (el) {
      var ms = Number(el.dataset.ms);
      var d = ms - now;
      var rel = d > 0 ? "in " + span(d) : span(d) + " ago";
      if (el.dataset.countdown) {
        el.textContent = (d > 0 ? span(d) + " left" : "due " + span(d) + " ago") +
          " (" + format.format(new Date(ms)) + ")";
      } else {
        el.textContent = format.format(new Date(ms)) + " (" + rel + ")";
      }
    });
  }
  window.timeboundTimes = render;
  render();
  setInterval(render, 1000);
})();
