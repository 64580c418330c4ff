// stepagent console: keeps a conversation page live without reloading it, and submits its forms in place.
// Plain JS, no build step. Every second it polls /api/c/{root}/poll (one store read): the live partial text
// is updated in place; when the signature changes (a commit, a new thread, a notice) the page's live part
// is fetched again, already rendered and escaped by the server.
(function () {
  "use strict";
  var csrf = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";
  var live = document.getElementById("live");
  var busy = false;

  function say(text, isError) {
    var main = document.querySelector("main");
    var box = document.getElementById("flash-js");
    if (!box) {
      box = document.createElement("p");
      box.id = "flash-js";
      main.insertBefore(box, main.firstChild);
    }
    box.className = isError ? "flash error" : "flash";
    box.textContent = text;
  }

  function refreshThreads() {
    // The send form's thread list follows the open threads of the tree.
    var select = document.querySelector("#send select[name=thread]");
    if (!select || !live) return;
    var chosen = select.value;
    var sections = live.querySelectorAll("section.thread");
    var options = [];
    sections.forEach(function (section) {
      if (section.getAttribute("data-closed") === "true") return;
      var id = section.getAttribute("data-thread-id");
      var option = document.createElement("option");
      option.value = id;
      option.textContent = id === live.getAttribute("data-root") ? id + " (root)" : id;
      options.push(option);
    });
    if (!options.length) return;
    select.replaceChildren.apply(select, options);
    if (options.some(function (o) { return o.value === chosen; })) select.value = chosen;
  }

  // What a person is typing into a tool's question survives the page's redraws (another thread's progress
  // re-renders the whole live part): the values are carried over to the same question's new form.
  function typedAnswers() {
    var kept = {};
    live.querySelectorAll("form.question [name^='field.']").forEach(function (input) {
      var form = input.closest("form");
      kept[form.getAttribute("data-tool-call-id") + "\n" + input.name] = input.value;
    });
    return kept;
  }

  function restoreAnswers(kept) {
    live.querySelectorAll("form.question [name^='field.']").forEach(function (input) {
      var key = input.closest("form").getAttribute("data-tool-call-id") + "\n" + input.name;
      if (Object.prototype.hasOwnProperty.call(kept, key)) input.value = kept[key];
    });
  }

  function rerender() {
    var root = live.getAttribute("data-root");
    return fetch("/c/" + encodeURIComponent(root) + "/fragment", { headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        if (!response.ok) return;
        var signature = response.headers.get("X-Signature");
        return response.text().then(function (body) {
          var kept = typedAnswers();
          live.innerHTML = body;
          restoreAnswers(kept);
          if (signature) live.setAttribute("data-signature", signature);
          refreshThreads();
        });
      });
  }

  function pollOnce() {
    if (busy || !live) return;
    busy = true;
    var root = live.getAttribute("data-root");
    fetch("/api/c/" + encodeURIComponent(root) + "/poll", { headers: { "X-Requested-With": "fetch" } })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (data) {
        if (!data) return;
        live.querySelectorAll("[data-partial]").forEach(function (box) {
          var partial = data.partials[box.getAttribute("data-partial")];
          box.hidden = !partial;
          if (partial) {
            box.querySelector(".phase").textContent = (partial.phase || "") + (partial.tool ? " " + partial.tool : "");
            box.querySelector(".text").textContent = partial.text || "";
          }
        });
        if (data.signature !== live.getAttribute("data-signature")) return rerender();
      })
      .catch(function () { /* the next poll tries again */ })
      .then(function () { busy = false; });
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.hasAttribute("data-ajax")) return;
    event.preventDefault();
    var body = new URLSearchParams(new FormData(form, event.submitter));
    var buttons = form.querySelectorAll("button");
    buttons.forEach(function (b) { b.disabled = true; });
    fetch(form.getAttribute("action"), {
      method: "POST",
      body: body,
      headers: { "X-Requested-With": "fetch", "X-CSRF-Token": csrf },
    })
      .then(function (response) { return response.json().catch(function () { return { error: response.statusText }; }); })
      .then(function (data) {
        if (data.error) { say(data.error, true); return; }
        say(data.message || "done", false);
        if (form.id === "send") form.querySelector("textarea").value = "";
        if (form.hasAttribute("data-reload")) { window.location.reload(); return; }
        if (live) return rerender();
      })
      .catch(function (error) { say(String(error), true); })
      .then(function () { buttons.forEach(function (b) { b.disabled = false; }); });
  });

  document.addEventListener("click", function (event) {
    var link = event.target.closest && event.target.closest("a.rewind");
    if (link && !window.confirm("Rewind this thread to here? Everything after it is dropped.")) event.preventDefault();
  });

  if (live) {
    refreshThreads();
    window.setInterval(pollOnce, 1000);
  }
})();
