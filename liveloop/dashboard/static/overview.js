// Polls /overview.json every 2 s and refreshes the overview's figures; no library, no build step.
"use strict";
(function () {
  function text(id, value) {
    var el = document.getElementById(id);
    if (el) { el.textContent = value === null || value === undefined ? "unknown" : String(value); }
  }
  function row(cells) {
    var tr = document.createElement("tr");
    cells.forEach(function (c) { var td = document.createElement("td"); td.textContent = c; tr.appendChild(td); });
    return tr;
  }
  function render(doc) {
    var t = doc.throughput || {};
    text("updated", doc.loading ? "loading: the first read of MLflow and the components is under way" : doc.at);
    text("age", doc.age_s === null || doc.age_s === undefined ? "?" : doc.age_s);
    text("events-per-s", t.events_per_s);
    text("samples-per-s", t.samples_per_s);
    text("dead-letters", t.dead_letters === undefined ? null : t.dead_letters + " (" + t.dead_letters_recent + ")");
    text("learner-step", doc.learner ? doc.learner.step : null);
    text("next-checkpoint", doc.learner ? doc.learner.next_checkpoint_at : null);
    var m = doc.models || {};
    text("champion", m.champion ? "v" + m.champion.version + (m.champion.since ? " since " + m.champion.since + " by " + m.champion.actor : "") : "none");
    text("candidate", m.candidate ? "v" + m.candidate.version : "none");
    text("last-decision", m.last_decision ? m.last_decision.decision + " v" + m.last_decision.version : "none");
    var comps = document.getElementById("components");
    comps.replaceChildren.apply(comps, (doc.components || []).map(function (c) {
      var health = c.healthy === true ? "up" : (c.healthy === false ? "down" : "unknown");
      return row([c.name, health, c.restarts === null ? "" : c.restarts, c.lag === null ? "" : c.lag]);
    }));
    var trend = document.getElementById("trend");
    trend.replaceChildren.apply(trend, (doc.trend || []).map(function (r) {
      return row(["v" + r.version, Number(r.reward).toFixed(3), Number(r.acceptance).toFixed(2)]);
    }));
    text("down", doc.down && doc.down.length ? "Down: " + doc.down.join(", ") : "No component down.");
    var errors = document.getElementById("errors");
    errors.replaceChildren.apply(errors, (doc.errors || []).map(function (e) {
      var p = document.createElement("p"); p.className = "error"; p.textContent = e; return p;
    }));
  }
  function poll() {
    fetch("/overview.json", { credentials: "same-origin" })
      .then(function (r) { if (r.status === 401) { window.location = "/signin?next=/"; } return r.json(); })
      .then(render)
      .catch(function (e) { text("updated", "failed (" + e + "), retrying"); })
      .finally(function () { window.setTimeout(poll, 2000); });
  }
  window.setTimeout(poll, 2000);
})();
