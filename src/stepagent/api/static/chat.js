// The chat page of the HTTP API: history from GET /v1/threads/{t}, live progress from the event stream
// (fetch + a small Server-Sent Events reader, because EventSource cannot send an Authorization header).
// A dropped stream reconnects with Last-Event-ID; a reloaded page replays the stream from the start, so the
// reply being written shows again from its first character and goes on.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const state = {
    token: "", thread: "", abort: null, lastId: null, refresh: null, live: new Map(), unfolded: new Set(),
    questions: new Map(), signins: new Map(), toolNames: new Map(),
  };

  function headers(extra) {
    return Object.assign({ Authorization: "Bearer " + state.token }, extra || {});
  }

  function status(text) { $("status").textContent = text; }

  async function api(method, path, body, extra) {
    const response = await fetch(path, {
      method, headers: headers(Object.assign(body ? { "Content-Type": "application/json" } : {}, extra)),
      body: body ? JSON.stringify(body) : undefined,
    });
    const data = await response.json().catch(() => null);
    if (!response.ok) {
      const error = new Error((data && data.error && data.error.message) || response.statusText);
      error.status = response.status;
      throw error;
    }
    return data;
  }

  function path(suffix) { return "/v1/threads/" + encodeURIComponent(state.thread) + (suffix || ""); }

  function itemText(item) {
    switch (item.kind) {
      case "tool_call": return "→ " + item.name + " " + JSON.stringify(item.args) + (item.approval ? " [" + item.approval + "]" : "");
      case "tool_result": return "← " + (item.text || "");
      default: return item.text || "";
    }
  }

  async function loadHistory() {
    let items;
    try {
      items = await api("GET", path());
    } catch (error) {
      if (error.status === 404) { $("transcript").replaceChildren(); return []; }
      throw error;
    }
    // The conversation itself first; each child thread's work (its seed instructions, its calls) folded
    // into one collapsed block after it: the page is what the app's users see.
    const list = items.filter((item) => item.thread_id === state.thread).map(itemElement);
    const children = new Map();
    for (const item of items) {
      if (item.thread_id === state.thread) continue;
      if (!children.has(item.thread_id)) children.set(item.thread_id, []);
      children.get(item.thread_id).push(item);
    }
    for (const [thread, childItems] of children) list.push(childElement(thread, childItems));
    // Messages sent but not yet committed (a step commits its input with its reply) show as pending.
    const users = items.filter((item) => item.kind === "user").map((item) => item.text);
    const pending = loadPending().filter((text) => {
      const at = users.indexOf(text);
      if (at >= 0) { users.splice(at, 1); return false; }
      return true;
    });
    savePending(pending);
    for (const text of pending) {
      const li = document.createElement("li");
      li.className = "user pending";
      li.dataset.kind = "user";
      li.textContent = text;
      list.push(li);
    }
    $("transcript").replaceChildren(...list);
    for (const item of items) {
      if (item.kind === "tool_call") state.toolNames.set(item.tool_call_id, item.name);
      if (item.kind === "tool_result") signedIn(item.tool_call_id);
    }
    renderSignins();
    renderApprovals(items.filter((item) => item.kind === "tool_call" && item.approval === "pending"));
    return items;
  }

  function itemElement(item) {
    const li = document.createElement("li");
    li.className = item.kind + (item.thread_id !== state.thread ? " child" : "");
    li.dataset.kind = item.kind;
    li.textContent = itemText(item);
    return li;
  }

  function childElement(thread, childItems) {
    const li = document.createElement("li");
    li.className = "child-thread";
    li.dataset.thread = thread;
    const details = document.createElement("details");
    details.open = state.unfolded.has(thread); // a refresh keeps what the user unfolded
    details.addEventListener("toggle", () => {
      if (details.open) state.unfolded.add(thread); else state.unfolded.delete(thread);
    });
    const summary = document.createElement("summary");
    summary.textContent = "A helper thread worked on this (" + childItems.length + " steps)";
    const inner = document.createElement("ul");
    inner.append(...childItems.map(itemElement));
    details.append(summary, inner);
    li.append(details);
    return li;
  }

  function pendingKey() { return "stepagent.pending." + state.thread; }
  function loadPending() { return JSON.parse(sessionStorage.getItem(pendingKey()) || "[]"); }
  function savePending(list) { sessionStorage.setItem(pendingKey(), JSON.stringify(list)); }

  function renderApprovals(pending) {
    const boxes = pending.map((call) => {
      const div = document.createElement("div");
      div.className = "approval";
      div.dataset.toolCallId = call.tool_call_id;
      const text = document.createElement("p");
      text.textContent = "Approve " + call.name + " " + JSON.stringify(call.args) + "?";
      div.append(text);
      for (const decision of ["approve", "reject"]) {
        const button = document.createElement("button");
        button.type = "button";
        button.textContent = decision === "approve" ? "Approve" : "Reject";
        button.dataset.decision = decision;
        button.addEventListener("click", async () => {
          div.querySelectorAll("button").forEach((b) => { b.disabled = true; });
          try {
            await api("POST", path("/approvals"), { tool_call_id: call.tool_call_id, decision },
              { "Idempotency-Key": "approval-" + call.tool_call_id });
            status("sent: " + decision);
            connect();
          } catch (error) { status("could not send: " + error.message); }
        });
        div.append(button);
      }
      return div;
    });
    $("approvals").replaceChildren(...boxes);
  }

  // A tool's question during a call (input_required): a form from its JSON Schema (one text box per
  // field; numbers and booleans are sent as such), or a page to open; Answer / Decline / Cancel post the
  // elicitation answer. The question goes away when the call's result arrives.
  function renderQuestions() {
    const boxes = Array.from(state.questions.values()).map((asked) => {
      const form = document.createElement("form");
      form.className = "question";
      form.dataset.toolCallId = asked.tool_call_id;
      const text = document.createElement("p");
      text.textContent = asked.message;
      form.append(text);
      const fields = (asked.requested_schema && asked.requested_schema.properties) || {};
      for (const [name, spec] of Object.entries(fields)) {
        const label = document.createElement("label");
        label.textContent = (spec && spec.title) || name;
        const input = document.createElement("input");
        input.name = name;
        input.dataset.type = (spec && spec.type) || "string";
        label.append(input);
        form.append(label);
      }
      if (asked.url) {
        const link = document.createElement("a");
        link.href = asked.url; link.target = "_blank"; link.rel = "noopener noreferrer";
        link.textContent = "open the page";
        form.append(link);
      }
      for (const action of ["accept", "decline", "cancel"]) {
        const button = document.createElement("button");
        button.type = "button";
        button.dataset.action = action;
        button.textContent = action === "accept" ? "Answer" : action === "decline" ? "Decline" : "Cancel";
        button.addEventListener("click", async () => {
          const body = { tool_call_id: asked.tool_call_id, action };
          if (action === "accept" && !asked.url) {
            body.content = {};
            for (const input of form.querySelectorAll("input")) {
              const raw = input.value;
              const type = input.dataset.type;
              body.content[input.name] = type === "number" || type === "integer" ? Number(raw)
                : type === "boolean" ? raw.trim().toLowerCase() === "true" : raw;
            }
          }
          form.querySelectorAll("button").forEach((b) => { b.disabled = true; });
          try {
            await api("POST", path("/elicitations"), body, { "Idempotency-Key": "elicitation-" + asked.tool_call_id + "-" + action });
            status("answered: " + action);
            state.questions.delete(asked.tool_call_id);
            renderQuestions();
          } catch (error) {
            form.querySelectorAll("button").forEach((b) => { b.disabled = false; });
            status("could not send: " + error.message);
          }
        });
        form.append(button);
      }
      return form;
    });
    $("questions").replaceChildren(...boxes);
  }

  // A tool that needs the user to sign in first (oauth_required): a card with the link (a new tab, with no
  // way back to this page), the tool it is for, and "waiting" until the call goes on — its result arrives,
  // on the stream or in the history — when the card says so. A new sign-in for the same call (a revoked
  // grant asked again) makes the card wait again. The stream replays only the notices recorded after it
  // opened, so the cards are kept in the tab's session storage: a reload shows them again. Only an http(s)
  // address becomes a link; anything else is shown as text with a warning. Everything is set as text.
  function httpUrl(text) {
    try {
      const url = new URL(text);
      return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
    } catch (error) { return null; }
  }

  function signinKey() { return "stepagent.signins." + state.thread; }
  function loadSignins() {
    state.signins.clear();
    for (const card of JSON.parse(sessionStorage.getItem(signinKey()) || "[]")) state.signins.set(card.tool_call_id, card);
  }
  function saveSignins() { sessionStorage.setItem(signinKey(), JSON.stringify(Array.from(state.signins.values()))); }

  function signedIn(callId) {
    const card = state.signins.get(callId);
    if (!card || card.done) return false;
    card.done = true;
    saveSignins();
    return true;
  }

  function renderSignins() {
    const cards = Array.from(state.signins.values()).map((asked) => {
      const div = document.createElement("div");
      div.className = "signin" + (asked.done ? " done" : "");
      div.dataset.toolCallId = asked.tool_call_id;
      const title = document.createElement("p");
      title.className = "title";
      title.textContent = asked.done ? "✔ Signed in" : "🔑 Sign in to continue";
      const what = document.createElement("p");
      const tool = document.createElement("code");
      tool.textContent = state.toolNames.get(asked.tool_call_id) || "a tool";
      what.append(tool, asked.done ? " went on after your sign-in." : " needs you to sign in to your account before it can go on.");
      div.append(title, what);
      if (!asked.done) {
        const href = httpUrl(asked.auth_url);
        if (href) {
          const link = document.createElement("a");
          link.className = "signin-link";
          link.href = href; link.target = "_blank"; link.rel = "noopener noreferrer";
          link.textContent = "Sign in";
          div.append(link);
        } else {
          const warning = document.createElement("p");
          warning.className = "warning";
          const shown = document.createElement("code");
          shown.textContent = String(asked.auth_url);
          warning.append("This sign-in address is not an http(s) link, so it is not opened from here: ", shown);
          div.append(warning);
        }
        const waiting = document.createElement("p");
        waiting.className = "state";
        waiting.textContent = "Waiting for you to sign in… the conversation goes on by itself once you have.";
        div.append(waiting);
      }
      return div;
    });
    $("signins").replaceChildren(...cards);
  }

  function renderLive() {
    $("live").textContent = Array.from(state.live.values()).join("\n");
  }

  function scheduleRefresh() {
    clearTimeout(state.refresh);
    state.refresh = setTimeout(() => loadHistory().catch((e) => status(e.message)), 50);
  }

  function onEvent(type, data) {
    if (type === "text_delta") {
      if (data.thread_id !== state.thread) return; // a child's reply being written is its own business
      state.live.set(data.thread_id, (state.live.get(data.thread_id) || "") + data.text);
      renderLive();
      return;
    }
    if (type === "text" || type === "turn_complete") { state.live.delete(data.thread_id); renderLive(); }
    if (type === "error") status("error: " + data.message);
    if (type === "input_required") { state.questions.set(data.tool_call_id, data); renderQuestions(); }
    if ((type === "tool_result" || type === "event") && state.questions.delete(data.tool_call_id)) renderQuestions();
    if (type === "tool_call") state.toolNames.set(data.tool_call_id, data.name);
    if (type === "oauth_required") {
      state.signins.set(data.tool_call_id, { tool_call_id: data.tool_call_id, thread_id: data.thread_id, auth_url: data.auth_url, done: false });
      saveSignins();
      renderSignins();
    }
    if ((type === "tool_result" || type === "event") && signedIn(data.tool_call_id)) renderSignins();
    if (type === "turn_complete" && data.thread_id === state.thread) status("idle");
    scheduleRefresh();
  }

  async function stream(signal) {
    const extra = { Accept: "text/event-stream" };
    if (state.lastId) extra["Last-Event-ID"] = state.lastId;
    const response = await fetch(path("/events?follow=1"), { headers: headers(extra), signal });
    if (!response.ok) {
      const data = await response.json().catch(() => null);
      const error = new Error((data && data.error && data.error.message) || response.statusText);
      error.status = response.status;
      throw error;
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let type = "message", id = null, data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event:")) type = line.slice(6).trim();
          else if (line.startsWith("id:")) id = line.slice(3).trim();
          else if (line.startsWith("data:")) data += line.slice(5).trim();
        }
        if (!data) continue;
        if (id) state.lastId = id;
        onEvent(type, JSON.parse(data));
      }
    }
  }

  async function connect() {
    if (state.abort) return;
    const abort = new AbortController();
    state.abort = abort;
    while (!abort.signal.aborted) {
      try {
        status("connected");
        await stream(abort.signal);
      } catch (error) {
        if (abort.signal.aborted) return;
        if (error.status === 404) { status("new conversation: say something"); state.abort = null; return; }
        if (error.status === 401) { status("the token was refused: " + error.message); state.abort = null; return; }
        status("reconnecting…");
      }
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  }

  function open() {
    state.token = $("token").value.trim();
    state.thread = $("thread").value.trim();
    localStorage.setItem("stepagent.token", state.token);
    localStorage.setItem("stepagent.thread", state.thread);
    if (state.abort) state.abort.abort();
    state.abort = null;
    state.lastId = null;
    state.live.clear();
    state.unfolded.clear();
    state.questions.clear();
    loadSignins();
    state.toolNames.clear();
    renderLive();
    renderQuestions();
    renderSignins();
    loadHistory().then(() => connect()).catch((e) => status(e.message));
  }

  $("session").addEventListener("submit", (event) => { event.preventDefault(); open(); });
  $("send").addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = $("text").value;
    if (!text.trim() || !state.thread) return;
    try {
      savePending([...loadPending(), text]);
      await api("POST", path("/messages"), { text }, { "Idempotency-Key": crypto.randomUUID() });
      $("text").value = "";
      status("sent");
      await loadHistory();
      connect();
    } catch (error) { status("could not send: " + error.message); }
  });

  $("token").value = localStorage.getItem("stepagent.token") || "";
  $("thread").value = localStorage.getItem("stepagent.thread") || "chat-" + Math.random().toString(36).slice(2, 10);
  if ($("token").value) open();
})();
