// The rating page: fetch a pair, show it, send one vote per question, move on.
// Text from the server is only ever set with textContent, so markup in a prompt shows as text.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  // Each key's answers, the first the study offers wins: the down arrow is the study's "neither" answer,
  // no preference or both bad.
  const KEYS = {
    ArrowLeft: ["A"], a: ["A"], A: ["A"], ArrowRight: ["B"], b: ["B"], B: ["B"],
    ArrowDown: ["none", "bad"], n: ["none"], N: ["none"], ArrowUp: ["good"], g: ["good"], G: ["good"],
    x: ["bad"], X: ["bad"],
  };
  // Buttons in page order; a study offers A, B and either no preference or both good and both bad.
  const LABELS = [["A", "Image A"], ["good", "Both good"], ["none", "No preference"], ["bad", "Both bad"], ["B", "Image B"]];
  const HINTS = {
    A: "\u2190/A image A", good: "\u2191/G both good", none: "\u2193/N no preference", bad: "\u2193/X both bad",
    B: "\u2192/B image B",
  };
  // The server's key for this rater goes with every request; it is kept in this browser only, so the
  // same rater id typed elsewhere starts a new rater instead of continuing this one.
  const state = { rater: null, key: null, pair: null, answered: {}, active: null, activeSince: 0, busy: false };
  const STORED = "dwb-rater-session";

  function show(section) {
    for (const id of ["start", "rate", "done"]) $(id).hidden = id !== section;
  }

  function setError(message) {
    $("error").textContent = message || "";
    $("error").hidden = !message;
  }

  async function api(method, url, body) {
    const init = { method, headers: state.key ? { "X-Rater-Key": state.key } : {} };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const res = await fetch(url, init);
    let data = null;
    try { data = await res.json(); } catch (_) { /* not JSON */ }
    if (!res.ok) {
      const err = new Error((data && data.detail) || `the server answered ${res.status}`);
      err.status = res.status;
      throw err;
    }
    return data;
  }

  function loadImage(img, url) {
    return new Promise((resolve) => {
      img.onload = img.onerror = () => resolve();
      img.src = url;
    });
  }

  function progress(p) {
    const shown = Math.min(p.completed + 1, p.total);
    $("progress-bar").max = p.total;
    $("progress-bar").value = p.completed;
    $("progress-text").textContent = `Pair ${shown} of ${p.total}`;
  }

  function renderQuestions() {
    const box = $("questions");
    box.replaceChildren();
    for (const q of state.pair.questions) {
      const div = document.createElement("div");
      div.className = "question";
      div.dataset.question = q.id;
      const text = document.createElement("p");
      text.textContent = q.text;
      div.append(text);
      for (const [answer, label] of LABELS.filter(([a]) => state.pair.answers.includes(a))) {
        const button = document.createElement("button");
        button.type = "button";
        button.textContent = label;
        button.dataset.answer = answer;
        button.addEventListener("click", () => vote(q.id, answer));
        div.append(button);
      }
      box.append(div);
    }
    refresh();
  }

  function refresh() {
    const open = state.pair.questions.filter((q) => !(q.id in state.answered));
    state.active = open.length ? open[0].id : null;
    for (const div of $("questions").children) {
      const id = div.dataset.question;
      div.classList.toggle("active", id === state.active);
      div.classList.toggle("answered", id in state.answered);
      for (const button of div.querySelectorAll("button")) {
        button.disabled = id in state.answered;
        button.classList.toggle("chosen", state.answered[id] === button.dataset.answer);
      }
    }
  }

  async function next() {
    const p = await api("GET", `/api/next?rater=${encodeURIComponent(state.rater)}`);
    progress(p.progress);
    if (p.done) {
      show("done");
      return;
    }
    state.pair = p;
    state.answered = { ...p.answered };
    $("prompt").textContent = p.prompt;
    $("keys").textContent = LABELS.filter(([a]) => p.answers.includes(a)).map(([a]) => HINTS[a]).join(" \u00b7 ");
    await Promise.all([loadImage($("img-left"), p.images[0]), loadImage($("img-right"), p.images[1])]);
    renderQuestions();
    show("rate");
    state.activeSince = performance.now();
  }

  async function vote(question, answer) {
    if (state.busy || !state.pair || question in state.answered) return;
    state.busy = true;
    const ms = Math.round(performance.now() - state.activeSince);
    try {
      await api("POST", "/api/vote", { rater: state.rater, pair: state.pair.pair, question, answer, response_ms: ms });
      setError("");
      state.answered[question] = answer;
      state.activeSince = performance.now();
      refresh();
      if (state.active === null) await next();
    } catch (e) {
      setError(`Your answer was not saved: ${e.message}. Please try again.`);
      if (e.status === 409) await next().catch(() => {});
    } finally {
      state.busy = false;
    }
  }

  function stored() {
    try { return JSON.parse(localStorage.getItem(STORED)) || {}; } catch (_) { return {}; }
  }

  // A link's key, or this browser's own session for the id typed; otherwise a new rater with that label.
  function sessionRequest(id, linkKey) {
    if (linkKey) return { rater: id, key: linkKey };
    const mine = stored();
    if (id && mine.key && (id === mine.label || id === mine.rater)) return { rater: mine.rater, key: mine.key };
    return { rater: id || null };
  }

  async function start(id, linkKey) {
    setError("");
    try {
      state.key = null;
      const s = await api("POST", "/api/session", sessionRequest(id, linkKey));
      state.rater = s.rater;
      state.key = s.key;
      localStorage.setItem(STORED, JSON.stringify({ rater: s.rater, label: s.label, key: s.key }));
      if (linkKey) history.replaceState(null, "", `/?rater=${encodeURIComponent(s.rater)}`);
      $("whoami").textContent = `Rater ID: ${s.label} (this browser continues where you left off)`;
      await next();
    } catch (e) {
      show("start");
      setError(`Could not start: ${e.message}`);
    }
  }

  document.addEventListener("keydown", (event) => {
    if (event.target instanceof HTMLInputElement || event.ctrlKey || event.metaKey || event.altKey) return;
    const answer = state.pair && (KEYS[event.key] || []).find((a) => state.pair.answers.includes(a));
    if (answer && state.active && !$("rate").hidden) {
      event.preventDefault();
      vote(state.active, answer);
    }
  });

  $("start-form").addEventListener("submit", (event) => {
    event.preventDefault();
    start($("rater-input").value.trim());
  });

  const params = new URLSearchParams(location.search);
  if (params.get("rater")) {
    start(params.get("rater"), params.get("key"));
  } else {
    $("rater-input").value = stored().label || "";
    show("start");
  }
})();
