// Instants as a person reads them (D8.22): each <time data-ms> shows the reader's local
// date-time and how long ago (or, with data-countdown, how long until), refreshed every second.
// The page's own text is ISO UTC, so the page reads correctly without this script.
(function () {
  "use strict";
  function span(ms) {
    var s = Math.round(Math.abs(ms) / 1000);
    if (s < 60) { return s + " s"; }
    if (s < 3600) { return Math.floor(s / 60) + " min " + (s % 60) + " s"; }
    if (s < 86400) { return Math.floor(s / 3600) + " h " + Math.floor(s % 3600 / 60) + " min"; }
    return Math.floor(s / 86400) + " d " + Math.floor(s % 86400 / 3600) + " h";
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
