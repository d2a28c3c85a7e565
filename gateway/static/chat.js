// Brigade chat: one WebSocket to the gateway that served this page (/v1/ws), answers streamed
// token by token into the last assistant bubble, and a dropped connection resumed from the last
// index shown (`resume` with the request_id of the `queued` event), so that an answer continues
// without gaps or repeats. Plain ES2020, no build step, nothing fetched from elsewhere.
"use strict";

const SUBPROTOCOL = "brigade";
// Browsers cannot set an Authorization header on a WebSocket: the key rides in a second subprotocol.
const BEARER_SUBPROTOCOL_PREFIX = "brigade.bearer.";
const API_KEY_STORAGE = "brigade.apiKey";
const RECONNECT_MIN_MS = 250;
const RECONNECT_MAX_MS = 8000;
const ANSWER_LIMITS = { maxTokens: [1, 4096], temperature: [0, 2] };

const $ = (selector) => document.querySelector(selector);

function newClientId() {
  // getRandomValues works on plain http too (randomUUID needs a secure context).
  const bytes = crypto.getRandomValues(new Uint8Array(8));
  return "c-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function gatewayUrl() {
  // Same origin only: the API key goes wherever this socket goes.
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}/v1/ws`;
}

function seconds(s) {
  return s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(2)} s`;
}

// ---- settings --------------------------------------------------------------------------------

const settings = {
  keyInput: null,
  maxTokensInput: null,
  temperatureInput: null,
  cacheSelect: null,

  init() {
    this.keyInput = $("#api-key");
    this.maxTokensInput = $("#max-tokens");
    this.temperatureInput = $("#temperature");
    this.cacheSelect = $("#cache");
    this.keyInput.value = localStorage.getItem(API_KEY_STORAGE) || "";
    // URL parameters preset a page (`?cache=off` for comparing uncached answers, for example).
    const params = new URLSearchParams(location.search);
    if (params.has("max_tokens")) this.maxTokensInput.value = params.get("max_tokens");
    if (params.has("temperature")) this.temperatureInput.value = params.get("temperature");
    const cache = params.get("cache");
    if (cache && [...this.cacheSelect.options].some((o) => o.value === cache)) this.cacheSelect.value = cache;
  },

  apiKey() {
    return this.keyInput.value.trim();
  },

  saveApiKey() {
    const key = this.apiKey();
    if (key) localStorage.setItem(API_KEY_STORAGE, key);
    else localStorage.removeItem(API_KEY_STORAGE);
    this.keyInput.closest("label").classList.remove("attention");
  },

  pointToApiKey() {
    const label = this.keyInput.closest("label");
    label.classList.add("attention");
    this.keyInput.focus();
  },

  // The generate fields from the settings row, or null (and the field reported) when one is invalid.
  generateFields() {
    const maxTokens = Number(this.maxTokensInput.value);
    const temperature = Number(this.temperatureInput.value);
    const [minTok, maxTok] = ANSWER_LIMITS.maxTokens;
    const [minTemp, maxTemp] = ANSWER_LIMITS.temperature;
    if (!Number.isInteger(maxTokens) || maxTokens < minTok || maxTokens > maxTok) {
      this.maxTokensInput.reportValidity();
      return null;
    }
    if (!Number.isFinite(temperature) || temperature < minTemp || temperature > maxTemp) {
      this.temperatureInput.reportValidity();
      return null;
    }
    const fields = { max_tokens: maxTokens, temperature };
    if (this.cacheSelect.value !== "auto") fields.cache = this.cacheSelect.value;
    return fields;
  },
};

// ---- the connection --------------------------------------------------------------------------

class GatewayConnection {
  constructor({ onOpen, onClose, onEvent, onStatus }) {
    Object.assign(this, { onOpen, onClose, onEvent, onStatus });
    this.ws = null;
    this.failedAttempts = 0;
    this.retryTimer = null;
    this.opens = 0; // connections that opened, for brigadeDebug
  }

  get isOpen() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  open() {
    clearTimeout(this.retryTimer);
    this.retryTimer = null;
    const key = settings.apiKey();
    const protocols = key ? [SUBPROTOCOL, BEARER_SUBPROTOCOL_PREFIX + key] : [SUBPROTOCOL];
    let ws;
    try {
      ws = new WebSocket(gatewayUrl(), protocols);
    } catch (err) {
      // A subprotocol must be an HTTP token: no spaces, quotes, commas and the like.
      this.onStatus("closed", "the API key has characters a WebSocket cannot carry");
      settings.pointToApiKey();
      return;
    }
    this.ws = ws;
    let opened = false;
    if (this.failedAttempts === 0) this.onStatus("connecting", "connecting…");
    ws.onopen = () => {
      if (ws !== this.ws) return;
      opened = true;
      this.opens += 1;
      this.failedAttempts = 0;
      this.onStatus("open", "connected");
      this.onOpen();
    };
    ws.onmessage = (msg) => {
      if (ws !== this.ws || typeof msg.data !== "string") return;
      let event;
      try {
        event = JSON.parse(msg.data);
      } catch (err) {
        console.warn("brigade: a frame that is not JSON", msg.data);
        return;
      }
      this.onEvent(event);
    };
    ws.onclose = (ev) => {
      if (ws !== this.ws) return; // replaced on purpose (a new API key)
      this.ws = null;
      if (!opened) this.failedAttempts += 1;
      this.onClose(ev);
      if (ev.code === 1008 && /unauthori[sz]ed/i.test(ev.reason)) {
        // The same key would be refused again: wait until the user enters another one.
        this.onStatus("closed", "unauthorized: enter a valid API key");
        settings.pointToApiKey();
        return;
      }
      this.scheduleReconnect();
    };
  }

  scheduleReconnect() {
    const attempt = this.failedAttempts;
    const delay = Math.min(RECONNECT_MAX_MS, RECONNECT_MIN_MS * 2 ** attempt) * (0.75 + Math.random() * 0.5);
    this.onStatus("reconnecting", attempt >= 3 ? "cannot reach the gateway; reconnecting…" : "reconnecting…");
    this.retryTimer = setTimeout(() => this.open(), delay);
  }

  reconnectNow() {
    if (this.retryTimer !== null) this.open();
  }

  // A fresh socket now, with the current settings (a new API key); only while nothing streams.
  restart() {
    const old = this.ws;
    this.ws = null;
    this.failedAttempts = 0;
    if (old) old.close(1000, "new settings");
    this.open();
  }

  // As if the network dropped: the close handler reconnects and the answer resumes.
  drop() {
    if (this.ws) this.ws.close(4000, "dropped");
  }

  send(message) {
    if (!this.isOpen) return false;
    this.ws.send(JSON.stringify(message));
    return true;
  }
}

// ---- the conversation view -------------------------------------------------------------------

const view = {
  messages: null,

  init() {
    this.messages = $("#messages");
  },

  // Keep following the stream only when the reader is already at the bottom.
  keepScrolled(change) {
    const m = this.messages;
    const atBottom = m.scrollHeight - m.scrollTop - m.clientHeight < 48;
    change();
    if (atBottom) m.scrollTop = m.scrollHeight;
  },

  clear() {
    this.messages.replaceChildren();
  },

  addUser(text) {
    this.messages.querySelector(".empty")?.remove();
    const root = document.createElement("div");
    root.className = "msg user";
    const body = document.createElement("div");
    body.className = "text";
    body.textContent = text;
    root.append(body);
    this.keepScrolled(() => this.messages.append(root));
  },

  addAssistant() {
    const root = document.createElement("div");
    root.className = "msg assistant";
    root.dataset.state = "streaming";
    const text = document.createElement("div");
    text.className = "text";
    const meta = document.createElement("div");
    meta.className = "meta";
    const stats = document.createElement("span");
    stats.className = "stats";
    meta.append(stats);
    root.append(text, meta);
    this.keepScrolled(() => this.messages.append(root));
    return { root, text, meta, stats };
  },

  notice(text) {
    const root = document.createElement("div");
    root.className = "msg notice";
    root.textContent = text;
    this.keepScrolled(() => this.messages.append(root));
  },
};

// ---- one answer --------------------------------------------------------------------------------

class Answer {
  constructor(question) {
    this.question = question;
    this.clientId = newClientId();
    this.wireId = this.clientId; // the id the current connection knows it by (request_id after a resume)
    this.requestId = null;
    this.lastIndex = -1;
    this.text = "";
    this.state = "streaming";
    this.sentAt = performance.now();
    this.firstTokenAt = null;
    this.endedAt = null;
    this.cached = null;
    this.usage = null;
    this.timing = null;
    this.finishReason = null;
    this.needsResume = false;
    this.resumes = 0;
    this.el = view.addAssistant();
    this.render();
  }

  matches(event) {
    return event.id === this.clientId || (this.requestId !== null && event.id === this.requestId);
  }

  queued(event) {
    this.requestId = event.request_id;
    this.el.root.dataset.requestId = event.request_id;
  }

  token(event) {
    if (event.index <= this.lastIndex) return; // already shown (the replay after a resume overlaps)
    if (event.index !== this.lastIndex + 1) {
      console.warn(`brigade: token ${event.index} after ${this.lastIndex}: a gap`);
    }
    this.lastIndex = event.index;
    if (this.firstTokenAt === null) this.firstTokenAt = performance.now();
    if (event.cached) this.cached = event.cached;
    this.text += event.text;
    this.render();
  }

  finish(event) {
    this.endedAt = performance.now();
    this.finishReason = event.finish_reason;
    this.usage = event.usage || null;
    this.timing = event.timing || null;
    if (event.cached) this.cached = event.cached;
    if (event.finish_reason === "cancelled") this.state = "stopped";
    else if (event.finish_reason === "error") this.fail({ code: "error", message: "the model failed on this request" });
    else this.state = "done";
    this.render();
  }

  fail(event) {
    this.endedAt = performance.now();
    this.state = "error";
    this.render();
    const box = document.createElement("div");
    box.className = "error";
    const code = document.createElement("code");
    code.textContent = event.code;
    box.append(code, `: ${event.message || "failed"}`);
    if (event.retry_after_s) box.append(` (try again in ${seconds(event.retry_after_s)})`);
    if (event.code === "unauthorized") {
      const hint = document.createElement("button");
      hint.type = "button";
      hint.className = "quiet";
      hint.textContent = "Set API key";
      hint.addEventListener("click", () => settings.pointToApiKey());
      box.append(" ", hint);
      settings.pointToApiKey();
    }
    this.el.root.append(box);
  }

  stopLocally() {
    this.endedAt = performance.now();
    this.finishReason = "cancelled";
    this.state = "stopped";
    this.needsResume = false;
    this.render();
  }

  get ended() {
    return this.state !== "streaming";
  }

  render() {
    view.keepScrolled(() => {
      this.el.root.dataset.state = this.state;
      if (this.el.text.textContent !== this.text) this.el.text.textContent = this.text;
      this.el.stats.textContent = this.statsLine();
      this.renderBadges();
      this.el.meta.hidden = !this.el.meta.textContent;
    });
  }

  renderBadges() {
    if (this.cached && !this.el.meta.querySelector(".cached")) {
      const badge = document.createElement("span");
      badge.className = "cached";
      badge.title = "answered from the cache";
      badge.textContent = `cached: ${this.cached}`;
      this.el.meta.prepend(badge);
    }
    if (this.state === "stopped" && !this.el.meta.querySelector(".stopped-mark")) {
      const mark = document.createElement("span");
      mark.className = "stopped-mark";
      mark.textContent = "stopped";
      this.el.meta.prepend(mark);
    }
  }

  statsLine() {
    const parts = [];
    if (this.firstTokenAt === null) {
      if (this.state === "streaming") parts.push(this.needsResume ? "reconnecting…" : this.requestId ? "queued…" : "sent…");
    } else {
      parts.push(`first token ${seconds((this.firstTokenAt - this.sentAt) / 1000)}`);
    }
    const serverTtft = this.timing && this.timing.ttft_s;
    if (typeof serverTtft === "number") parts.push(`server ${seconds(serverTtft)}`);
    const rate = this.tokensPerSecond();
    if (rate !== null) parts.push(`${rate.toFixed(1)} tok/s`);
    const tokens = this.usage && this.usage.completion_tokens;
    if (this.ended && typeof tokens === "number") parts.push(`${tokens} tokens`);
    if (this.finishReason && this.finishReason !== "cancelled") parts.push(this.finishReason);
    if (this.resumes) parts.push(`resumed${this.resumes > 1 ? " ×" + this.resumes : ""}`);
    if (this.state === "streaming" && this.needsResume && this.firstTokenAt !== null) parts.push("reconnecting…");
    return parts.join(" · ");
  }

  // Tokens after the first over the time since the first (the first token's wait is TTFT's).
  tokensPerSecond() {
    if (this.cached || this.firstTokenAt === null) return null;
    const end = this.endedAt !== null ? this.endedAt : performance.now();
    const done = this.usage && typeof this.usage.completion_tokens === "number";
    const count = done ? this.usage.completion_tokens : this.lastIndex + 1;
    const elapsed = (end - this.firstTokenAt) / 1000;
    if (count < 2 || elapsed <= 0) return null;
    return (count - 1) / elapsed;
  }
}

// ---- the page ----------------------------------------------------------------------------------

const chat = {
  history: [], // finished turns, sent whole with every question
  current: null, // the answer streaming now, if any
  connection: null,
  statsTimer: null,

  init() {
    settings.init();
    view.init();
    this.prompt = $("#prompt");
    this.sendButton = $("#send");
    this.stopButton = $("#stop");
    this.status = $("#status");
    this.connection = new GatewayConnection({
      onOpen: () => this.connected(),
      onClose: () => this.disconnected(),
      onEvent: (event) => this.dispatch(event),
      onStatus: (state, text) => this.showStatus(state, text),
    });

    $("#composer").addEventListener("submit", (e) => {
      e.preventDefault();
      this.send();
    });
    this.prompt.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        this.send();
      }
    });
    this.stopButton.addEventListener("click", () => this.stop());
    $("#new-chat").addEventListener("click", () => this.newChat());
    $("#settings").addEventListener("submit", (e) => e.preventDefault());
    settings.keyInput.addEventListener("change", () => {
      settings.saveApiKey();
      // A streaming answer keeps its socket; the next connection uses the new key.
      if (this.current === null || !this.connection.isOpen) this.connection.restart();
    });
    window.addEventListener("online", () => this.connection.reconnectNow());

    this.connection.open();
    this.updateControls();
    this.prompt.focus();
  },

  showStatus(state, text) {
    this.status.dataset.state = state;
    this.status.textContent = text;
    this.updateControls();
  },

  updateControls() {
    const streaming = this.current !== null;
    this.sendButton.disabled = streaming || !this.connection.isOpen;
    this.stopButton.disabled = !streaming;
  },

  send() {
    const question = this.prompt.value.trim();
    if (!question || this.current !== null || !this.connection.isOpen) return;
    const fields = settings.generateFields();
    if (fields === null) return;
    const messages = [...this.history, { role: "user", content: question }];
    view.addUser(question);
    const answer = new Answer(question);
    this.current = answer;
    this.connection.send({ type: "generate", id: answer.clientId, messages, ...fields });
    this.prompt.value = "";
    // Refresh tokens per second between tokens too (a slow token would freeze the figure).
    this.statsTimer = setInterval(() => answer.render(), 500);
    this.updateControls();
  },

  stop() {
    const answer = this.current;
    if (answer === null) return;
    if (this.connection.isOpen && !answer.needsResume && this.connection.send({ type: "cancel", id: answer.wireId })) {
      this.stopButton.disabled = true; // the gateway answers `done` with finish_reason "cancelled"
      return;
    }
    // Disconnected: not resuming is enough, the gateway cancels it after its grace time.
    answer.stopLocally();
    this.ended(answer);
  },

  newChat() {
    if (this.current !== null) this.stop();
    if (this.current !== null) this.ended(this.current);
    this.history = [];
    view.clear();
  },

  dispatch(event) {
    const answer = this.current;
    if (event.type === "error" && !event.id) {
      // An error about a message with no usable id; `duplicate_id` leaves the running request alone.
      if (answer !== null && event.code !== "duplicate_id") {
        answer.fail(event);
        this.ended(answer);
      } else {
        view.notice(`${event.code}: ${event.message}`);
        if (event.code === "unauthorized") settings.pointToApiKey();
      }
      return;
    }
    if (answer === null || !answer.matches(event)) return; // a late event for an answer already ended
    if (event.type === "queued") {
      answer.queued(event);
    } else if (event.type === "token") {
      answer.token(event);
    } else if (event.type === "done") {
      answer.finish(event);
      this.ended(answer);
    } else if (event.type === "error") {
      answer.fail(event);
      this.ended(answer);
    }
  },

  ended(answer) {
    if (this.current !== answer) return;
    clearInterval(this.statsTimer);
    this.current = null;
    if (answer.state !== "error" && answer.text) {
      this.history.push({ role: "user", content: answer.question }, { role: "assistant", content: answer.text });
    }
    this.updateControls();
  },

  connected() {
    const answer = this.current;
    if (answer !== null && answer.needsResume) {
      answer.needsResume = false;
      answer.wireId = answer.requestId; // a resumed stream's events carry the request_id as their id
      answer.resumes += 1;
      this.connection.send({ type: "resume", id: answer.requestId, after_index: answer.lastIndex });
      answer.render();
    }
    this.updateControls();
  },

  disconnected() {
    const answer = this.current;
    if (answer !== null && !answer.needsResume) {
      if (answer.requestId === null) {
        // Without the queued event there is nothing to resume.
        answer.fail({ code: "connection_lost", message: "the connection dropped before the request was queued; send it again" });
        this.ended(answer);
      } else {
        answer.needsResume = true;
        answer.render();
      }
    }
    this.updateControls();
  },
};

window.brigadeDebug = {
  dropConnection() {
    chat.connection.drop();
  },
  state() {
    const a = chat.current;
    return {
      connected: chat.connection.isOpen,
      opens: chat.connection.opens,
      history: chat.history.length,
      current: a && { clientId: a.clientId, requestId: a.requestId, lastIndex: a.lastIndex, state: a.state },
    };
  },
};

document.addEventListener("DOMContentLoaded", () => chat.init());
