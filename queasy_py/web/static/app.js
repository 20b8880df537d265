// queasy dashboard: refresh the counts and the charts of the page every data-refresh seconds
// (the main page only), from this dashboard's own /api/status and /api/charts.
(function () {
  "use strict";
  var seconds = parseFloat(document.body.getAttribute("data-refresh") || "0");
  if (!(seconds > 0)) { return; }
  function refresh() {
    if (document.hidden) { return; }
    fetch("/api/status", { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (status) {
        if (!status) { return; }
        document.querySelectorAll("[data-q][data-k]").forEach(function (cell) {
          var counts = status.counts[cell.getAttribute("data-q")];
          if (counts) { cell.textContent = counts[cell.getAttribute("data-k")]; }
        });
      })
      .catch(function () {});
    var charts = document.getElementById("charts");
    if (charts) {
      fetch("/api/charts", { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) { if (html) { charts.innerHTML = html; } })
        .catch(function () {});
    }
  }
  setInterval(refresh, seconds * 1000);
}());
