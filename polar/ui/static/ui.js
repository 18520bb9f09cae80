// Polar web UI: live refresh of running rollouts, lazily loaded capture JSON, token paging, heat toggle.
"use strict";

function liveRows() {
  const table = document.getElementById("rollouts");
  if (!table || table.dataset.live !== "yes") return;
  const url = new URL(window.location.href);
  url.searchParams.set("fragment", "rows");
  const timer = setInterval(async () => {
    const reply = await fetch(url, { credentials: "same-origin" });
    if (!reply.ok) return;
    const body = table.querySelector("tbody");
    body.innerHTML = await reply.text();
    if (!body.querySelector("tr.running")) clearInterval(timer);
  }, 2000);
}

function liveStages() {
  const box = document.getElementById("stages-box");
  if (!box || !box.querySelector('[data-terminal="no"]')) return;
  const timer = setInterval(async () => {
    const reply = await fetch(box.dataset.src, { credentials: "same-origin" });
    if (!reply.ok) return;
    box.innerHTML = await reply.text();
    if (box.querySelector('[data-terminal="yes"]')) {
      clearInterval(timer);
      window.location.reload(); // captures and trajectories are final now
    }
  }, 2000);
}

// The live page: each part with data-src is fetched again every data-every ms and replaced in place.
function liveParts() {
  for (const part of document.querySelectorAll(".live-part[data-src]")) {
    setInterval(async () => {
      try {
        const reply = await fetch(part.dataset.src, { credentials: "same-origin" });
        if (reply.ok) part.innerHTML = await reply.text();
      } catch (error) { /* the server is restarting: the next tick tries again */ }
    }, Number(part.dataset.every) || 2000);
  }
}

function lazyJson() {
  document.addEventListener("toggle", async (event) => {
    const details = event.target;
    if (!details.classList || !details.classList.contains("lazy-json") || !details.open || details.dataset.loaded) return;
    details.dataset.loaded = "1";
    const pre = details.querySelector("pre");
    const reply = await fetch(details.dataset.src, { credentials: "same-origin" });
    pre.textContent = JSON.stringify(await reply.json(), null, 2);
  }, true);
}

function paging() {
  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button.more");
    if (!button) return;
    button.disabled = true;
    const reply = await fetch(`/ui/trajectories/${button.dataset.traj}/tokens?page=${button.dataset.next}`,
      { credentials: "same-origin" });
    if (!reply.ok) { button.disabled = false; return; }
    button.insertAdjacentHTML("afterend", await reply.text());
    button.remove();
  });
  document.addEventListener("change", (event) => {
    if (!event.target.classList.contains("heat-switch")) return;
    event.target.closest(".trajectory").classList.toggle("heat", event.target.checked);
  });
}

// Logprob on hover: the title is made when the pointer reaches a token (not shipped with every token).
function hoverTitles() {
  document.addEventListener("mouseover", (event) => {
    const token = event.target;
    if (!token.classList || !token.classList.contains("t") || token.title) return;
    const page = token.closest(".tpage");
    if (!page) return;
    const index = Array.prototype.indexOf.call(page.querySelectorAll(".t"), token) + Number(page.dataset.start);
    const prompt = Number(page.dataset.prompt);
    const parts = [`#${index}`];
    if (token.dataset.m === undefined) parts.push("prompt");
    else parts.push(token.dataset.m === "1" ? "trainable" : "inserted (masked)");
    if (token.dataset.lp !== undefined) {
      const lp = Number(token.dataset.lp);
      parts.push(`logprob ${lp.toFixed(4)} (p=${Math.exp(lp).toFixed(3)})`);
    }
    if (index >= prompt) parts.push(`response token ${index - prompt}`);
    token.title = parts.join(" · ");
  });
}

document.addEventListener("DOMContentLoaded", () => { liveRows(); liveStages(); liveParts(); lazyJson(); paging(); hoverTitles(); });
