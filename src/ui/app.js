// The dashboard: watches every listed key on ONE EventSource (browsers allow
// only six HTTP/1.1 streams per origin), shared with the other tabs of the
// gateway through a SharedWorker, and sets or deletes values with fetch.
// All URLs are relative to the page, so it works behind a prefix.
'use strict';

(() => {
  const STORAGE_KEY = 'statestore-gateway.ui.keys';
  // Keys shown as locks (the SDKs' convention: the value is the holder).
  const LOCKS_KEY = 'statestore-gateway.ui.locks';
  // The API token lives in sessionStorage: this tab only, gone when it closes.
  const TOKEN_KEY = 'statestore-gateway.ui.token';
  // The page is served at <root>/ui/; the API lives at <root>/.
  const API_ROOT = new URL('../', document.baseURI);
  const REQUEST_TIMEOUT_MS = 15000;
  const RETRY_MIN_MS = 1000;
  const RETRY_MAX_MS = 30000;
  const MAX_ERRORS_SHOWN = 5;
  const BROWSE_PAGE = 20; // keys per listing page
  const SPARK_POINTS = 60; // numeric values kept per key for its sparkline
  const SVG_NS = 'http://www.w3.org/2000/svg';
  // The followed pattern, kept across visits.
  const FOLLOW_KEY = 'statestore-gateway.ui.follow';
  const CHART_POINTS = 240; // numeric values kept per followed key for its chart
  const CHART_TICK_MS = 1000;
  const CHART_MIN_SPAN_MS = 5000; // the time axis spans at least this much
  const LEAVE_MS = 1200; // a deleted key's row stays this long, marked, before it leaves
  const VALUE_SHOWN = 400; // characters of a value shown in the followed table
  const TOPIC_KEY = 'statestore-gateway.ui.topic'; // the followed topic filter, kept across visits
  const MESSAGES_SHOWN = 100; // messages of a followed topic kept on the page, newest first
  const PAYLOAD_SHOWN = 300; // characters of a payload shown (the whole in its title)
  // The worker that shares the streams of every tab; a new name for a
  // change of its messages, so that tabs never talk to an older one.
  const STREAM_WORKER = 'statestore-gateway.ui.streams.2';
  const PING_MS = 20_000; // well within the worker's patience (stream-worker.js)

  const $ = (id) => document.getElementById(id);
  const ui = {
    connection: $('connection'),
    connectionText: $('connection-text'),
    addForm: $('add-form'),
    addKey: $('add-key'),
    addLock: $('add-lock'),
    errors: $('errors'),
    notice: $('notice'),
    table: $('keys'),
    rows: $('rows'),
    empty: $('empty'),
    template: $('row-template'),
    tokenBox: $('token-box'),
    tokenForm: $('token-form'),
    token: $('token'),
    browseForm: $('browse-form'),
    browsePattern: $('browse-pattern'),
    browseStatus: $('browse-status'),
    browseList: $('browse-list'),
    browseMore: $('browse-more'),
    followStart: $('follow-start'),
    follow: $('follow'),
    followPattern: $('follow-pattern'),
    followConnection: $('follow-connection'),
    followText: $('follow-text'),
    followCount: $('follow-count'),
    followStop: $('follow-stop'),
    followTable: $('follow-table'),
    followRows: $('follow-rows'),
    followEmpty: $('follow-empty'),
    followTemplate: $('follow-row-template'),
    chart: $('chart'),
    chartKey: $('chart-key'),
    chartNote: $('chart-note'),
    chartSvg: $('chart-svg'),
    topicForm: $('topic-form'),
    topicFilter: $('topic-filter'),
    topicStop: $('topic-stop'),
    topicConnection: $('topic-connection'),
    topicText: $('topic-text'),
    topicNotice: $('topic-notice'),
    topicBox: $('topic-box'),
    topicTable: $('topic-table'),
    topicFollowed: $('topic-followed'),
    topicRows: $('topic-rows'),
    topicEmpty: $('topic-empty'),
    topicTemplate: $('topic-row-template'),
  };

  /** key -> { key, row, exists, value, valueBase64, version, kind, flags, at, error, history } */
  const watched = new Map();
  const locks = new Set(loadList(LOCKS_KEY));
  const watching = newStream();
  const sharedStreams = connectStreamWorker();

  // ---- URLs --------------------------------------------------------------

  /** `keys/<key>`; throws for keys a URL path cannot carry. */
  function keyUrl(key) {
    if (key === '.' || key === '..') {
      throw new Error(`the key "${key}" cannot be written in a URL path`);
    }
    return new URL('keys/' + encodeURIComponent(key), API_ROOT);
  }

  function watchUrl(keys) {
    const query = keys.map((key) => 'key=' + encodeURIComponent(key));
    // EventSource cannot send an Authorization header: the gateway takes
    // the token as `access_token` on watch streams (RFC 6750, 2.3).
    const token = apiToken();
    if (token) query.push('access_token=' + encodeURIComponent(token));
    return new URL('watch?' + query.join('&'), API_ROOT);
  }

  function apiToken() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || '';
    } catch {
      return '';
    }
  }

  /** Headers for fetch: the token, when one was given. */
  function authHeaders() {
    const token = apiToken();
    return token ? { Authorization: `Bearer ${token}` } : {};
  }

  /** Whether the key can travel in a URL (a lone UTF-16 surrogate cannot). */
  function encodable(key) {
    try {
      encodeURIComponent(key);
      return true;
    } catch {
      return false;
    }
  }

  // ---- persistence -------------------------------------------------------

  function loadKeys() {
    return loadList(STORAGE_KEY);
  }

  function loadList(name) {
    try {
      const stored = JSON.parse(localStorage.getItem(name) || '[]');
      if (!Array.isArray(stored)) return [];
      return [...new Set(stored.filter((k) => typeof k === 'string' && k !== '' && encodable(k)))];
    } catch {
      return [];
    }
  }

  function saveKeys() {
    try {
      localStorage.setItem(STORAGE_KEY, JSON.stringify([...watched.keys()]));
      localStorage.setItem(LOCKS_KEY, JSON.stringify([...locks].filter((k) => watched.has(k))));
    } catch (err) {
      showError(`The key list could not be saved in this browser: ${err.message}`);
    }
  }

  // ---- messages ----------------------------------------------------------

  /** `origin` 'watch' marks errors of the stream, cleared once it is live again. */
  function showError(message, origin = 'action') {
    // The same failure again (a refused stream retrying) counts up instead of stacking.
    const latest = ui.errors.firstElementChild;
    if (latest && latest.querySelector('.text').textContent === message) {
      const count = Number(latest.dataset.count) + 1;
      latest.dataset.count = String(count);
      latest.querySelector('.count').textContent = ` (${count} times)`;
      return;
    }
    const item = document.createElement('p');
    item.className = 'error';
    item.dataset.count = '1';
    item.dataset.origin = origin;
    const text = document.createElement('span');
    text.className = 'text';
    text.textContent = message;
    const count = document.createElement('span');
    count.className = 'count';
    const dismiss = document.createElement('button');
    dismiss.type = 'button';
    dismiss.className = 'dismiss';
    dismiss.textContent = 'Dismiss';
    dismiss.setAttribute('aria-label', 'Dismiss this error');
    dismiss.addEventListener('click', () => item.remove());
    const words = document.createElement('span');
    words.append(text, count);
    item.append(words, dismiss);
    ui.errors.prepend(item);
    while (ui.errors.children.length > MAX_ERRORS_SHOWN) ui.errors.lastElementChild.remove();
  }

  function showNotice(message) {
    ui.notice.textContent = message;
  }

  /** A readable message from a failed answer: problem+json title and detail if any. */
  async function describeFailure(response) {
    if (response.status === 401) {
      ui.tokenBox.open = true;
      return apiToken()
        ? 'the gateway refused the API token (HTTP 401)'
        : 'the gateway needs an API token: enter it under "API token" (HTTP 401)';
    }
    const status = `HTTP ${response.status}`;
    let body = '';
    try {
      body = await response.text();
    } catch {
      return status;
    }
    const type = response.headers.get('content-type') || '';
    if (type.includes('json')) {
      try {
        const problem = JSON.parse(body);
        const parts = [problem.title, problem.detail].filter((p) => typeof p === 'string' && p !== '');
        if (parts.length > 0) return `${parts.join(': ')} (${status})`;
      } catch {
        // fall through to the raw text
      }
    }
    const text = body.trim().slice(0, 200);
    return text ? `${text} (${status})` : `${response.statusText || 'failed'} (${status})`;
  }

  /** The `type` of a problem+json answer, or ''. */
  async function problemType(response) {
    try {
      const problem = await response.json();
      return typeof problem?.type === 'string' ? problem.type : '';
    } catch {
      return '';
    }
  }

  /** fetch with a deadline and messages a person can act on. */
  async function request(method, url, body) {
    const init = {
      method,
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      cache: 'no-store',
      headers: authHeaders(),
    };
    if (body !== undefined) {
      init.body = body;
      init.headers['Content-Type'] = 'text/plain; charset=utf-8';
    }
    try {
      return await fetch(url, init);
    } catch (err) {
      if (err.name === 'TimeoutError') {
        throw new Error(`no answer from the gateway within ${REQUEST_TIMEOUT_MS / 1000} s`);
      }
      throw new Error(`the gateway cannot be reached (${err.message})`);
    }
  }

  // ---- streams shared by the tabs -------------------------------------------
  //
  // The tabs of a gateway share their streams through one SharedWorker
  // (stream-worker.js): one connection per distinct stream URL, however many
  // tabs show it, where each tab's own would run out of the six a browser
  // allows per origin. A SharedEventSource stands in for an EventSource
  // (the same events, the same readyState), so the stream code below works
  // with either. Where there is no SharedWorker, a tab opens its own.

  /** An EventSource held by the stream worker for this tab and others. */
  class SharedEventSource extends EventTarget {
    constructor(shared, url) {
      super();
      this.shared = shared;
      this.url = String(url);
      this.id = shared.nextId;
      shared.nextId += 1;
      this.readyState = EventSource.CONNECTING;
      shared.sources.set(this.id, this);
      shared.post({ type: 'subscribe', id: this.id, url: this.url });
    }

    close() {
      this.readyState = EventSource.CLOSED;
      if (this.shared.sources.delete(this.id)) this.shared.post({ type: 'unsubscribe', id: this.id });
    }

    /** What the worker says of this stream, told as the EventSource would. */
    receive(message) {
      switch (message.type) {
        case 'open':
          this.readyState = EventSource.OPEN;
          this.dispatchEvent(new Event('open'));
          break;
        case 'event':
          this.dispatchEvent(new MessageEvent(message.kind, { data: message.data, lastEventId: message.lastEventId }));
          break;
        case 'reconnecting':
          this.readyState = EventSource.CONNECTING;
          this.dispatchEvent(new Event('error'));
          break;
        case 'closed':
          this.shared.sources.delete(this.id);
          this.readyState = EventSource.CLOSED;
          this.dispatchEvent(new Event('error'));
          break;
      }
    }
  }

  /** The stream worker's port and this tab's streams on it; null where tabs cannot share. */
  function connectStreamWorker() {
    if (typeof SharedWorker !== 'function') return null;
    let worker;
    try {
      worker = new SharedWorker('stream-worker.js', { name: STREAM_WORKER });
    } catch {
      return null;
    }
    const shared = {
      sources: new Map(), // id -> SharedEventSource
      nextId: 1,
      lock: null, // the Web Lock this tab holds while it lives, once granted
      failed: false,
      post: (message) => worker.port.postMessage(message),
    };
    worker.port.addEventListener('message', (event) => {
      for (const message of event.data?.batch ?? []) {
        if (message.type === 'expired') rejoin(shared);
        else shared.sources.get(message.id)?.receive(message);
      }
    });
    worker.port.start();
    shared.post({ type: 'hello' });
    holdTabLock(shared);
    // A worker that cannot start (it did not load): its streams end as
    // refused ones do, and are opened again by this tab alone.
    worker.addEventListener('error', () => {
      shared.failed = true;
      for (const source of [...shared.sources.values()]) source.receive({ type: 'closed' });
    });
    setInterval(() => shared.post({ type: 'ping' }), PING_MS);
    // Leaving (closed, reloaded, or into the back/forward cache) lets go of
    // the streams at once; back from the cache, the tab subscribes again.
    window.addEventListener('pagehide', () => shared.post({ type: 'leave' }));
    window.addEventListener('pageshow', (event) => {
      if (event.persisted) rejoin(shared);
    });
    return shared;
  }

  /**
   * Holds a Web Lock for as long as the tab lives, and names it to the
   * worker: once the worker gets it, the tab is gone, even one that could
   * not say so (it crashed). Web Locks need a secure context; elsewhere the
   * worker goes by the pings.
   */
  function holdTabLock(shared) {
    if (!navigator.locks) return;
    const random = crypto.getRandomValues(new Uint32Array(2));
    const name = `statestore-gateway.ui.tab.${random[0].toString(36)}.${random[1].toString(36)}`;
    navigator.locks
      .request(name, () => {
        shared.lock = name;
        shared.post({ type: 'lock', name });
        return new Promise(() => {}); // never let go
      })
      .catch(() => {});
  }

  /** The worker dropped this tab (it left, or was silent too long): subscribe again. */
  function rejoin(shared) {
    shared.post({ type: 'hello' });
    if (shared.lock) shared.post({ type: 'lock', name: shared.lock });
    for (const source of shared.sources.values()) {
      shared.post({ type: 'subscribe', id: source.id, url: source.url });
    }
  }

  /** An EventSource for `url`: shared with the other tabs where possible. */
  function openSource(url) {
    if (sharedStreams && !sharedStreams.failed) return new SharedEventSource(sharedStreams, url);
    return new EventSource(url);
  }

  // ---- the event stream --------------------------------------------------

  function setConnection(state, text) {
    ui.connection.dataset.state = state;
    ui.connectionText.textContent = text;
    ui.table.classList.toggle('stale', state !== 'live');
  }

  /** One EventSource with its retry state; the page has two (watched keys, a followed pattern). */
  function newStream() {
    return { source: null, retryTimer: null, retryDelay: RETRY_MIN_MS, generation: 0 };
  }

  function closeStream(stream) {
    if (stream.source) {
      stream.source.close();
      stream.source = null;
    }
    if (stream.retryTimer !== null) {
      clearTimeout(stream.retryTimer);
      stream.retryTimer = null;
    }
  }

  /**
   * Opens `url` as the stream's EventSource; `on.open`, `on.event(kind, event)`
   * and `on.state(state, text)` hear only from this one, not from a stream it
   * replaced. A connection that drops is retried by EventSource itself; one
   * the gateway refused is explained, then retried with backoff when asking
   * again could help (busy, not a refused key set or pattern). `origin`
   * tags the errors it shows, removed once the stream is open again.
   */
  function openEventSource(stream, url, kinds, origin, on) {
    closeStream(stream);
    stream.generation += 1;
    const source = openSource(url);
    stream.source = source;
    on.state('connecting', 'Connecting…');

    source.addEventListener('open', () => {
      if (stream.source !== source) return;
      stream.retryDelay = RETRY_MIN_MS;
      for (const stale of ui.errors.querySelectorAll(`[data-origin="${origin}"]`)) stale.remove();
      on.open();
    });
    for (const kind of kinds) {
      source.addEventListener(kind, (event) => {
        if (stream.source === source) on.event(kind, event);
      });
    }
    source.addEventListener('error', (event) => {
      if (stream.source !== source) return;
      // The gateway's own `event: error` arrives as a MessageEvent with data;
      // a broken connection arrives as a plain Event.
      if (event instanceof MessageEvent) {
        on.event('error', event);
        return;
      }
      if (source.readyState === EventSource.CONNECTING) {
        on.state('reconnecting', 'Reconnecting…');
        return;
      }
      // CLOSED: the gateway refused the stream. EventSource does not say
      // why, so ask once: a busy gateway (429, 5xx) is retried with backoff;
      // a refused key set or pattern waits for a change.
      source.close();
      stream.source = null;
      const opened = stream.generation;
      on.state('refused', 'Not connected');
      explainRefusal(url).then(({ message, retry, unauthorized }) => {
        if (opened !== stream.generation) return; // replaced meanwhile
        showError(`${on.failure}: ${message}`, origin);
        if (unauthorized) {
          on.state('refused', 'Not connected: the gateway needs its API token');
          return;
        }
        if (!retry) {
          on.state('refused', on.refusedText);
          return;
        }
        const delay = stream.retryDelay;
        stream.retryDelay = Math.min(stream.retryDelay * 2, RETRY_MAX_MS);
        on.state('refused', `Not connected; retrying in ${Math.round(delay / 1000)} s`);
        stream.retryTimer = setTimeout(() => {
          stream.retryTimer = null;
          on.reopen();
        }, delay);
      });
    });
  }

  /** (Re)opens the one stream for the current key set. */
  function openStream() {
    const keys = [...watched.keys()];
    if (keys.length === 0) {
      closeStream(watching);
      watching.generation += 1;
      setConnection('idle', 'No keys watched');
      return;
    }
    openEventSource(watching, watchUrl(keys), ['sync', 'set', 'delete'], 'watch', {
      failure: 'Watching failed',
      refusedText: 'Not watching: change the keys',
      open: () => {
        const n = keys.length;
        setConnection('live', `Live: watching ${n} key${n === 1 ? '' : 's'}`);
      },
      event: onStoreEvent,
      state: (state, text) => setConnection(state, text.replace('Not connected', 'Not watching')),
      reopen: openStream,
    });
  }

  /**
   * Why the gateway refused a stream: repeats the request and reads the
   * problem. `retry` is false when the same request would be refused again;
   * `unauthorized` when the token is missing or wrong (the token form
   * reopens the streams).
   */
  async function explainRefusal(url) {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), 5000);
    try {
      const response = await fetch(url, {
        headers: { Accept: 'text/event-stream' },
        signal: abort.signal,
        cache: 'no-store',
      });
      if (response.ok) {
        return { message: 'the stream was closed by the gateway', retry: true };
      }
      // A busy gateway may take the stream later; too many keys, never.
      const type = await problemType(response.clone());
      const retry = (response.status === 408 || response.status === 429 || response.status >= 500) &&
        !/\/problems\/too-many(-pattern)?-keys$/.test(type);
      const unauthorized = response.status === 401;
      return { message: await describeFailure(response), retry, unauthorized };
    } catch {
      return { message: 'the gateway cannot be reached', retry: true };
    } finally {
      clearTimeout(timer);
      abort.abort(); // never keep a second stream open
    }
  }

  // An event's data as an object, or null (said on the page when not JSON).
  function eventData(kind, event) {
    try {
      const data = JSON.parse(event.data);
      return data !== null && typeof data === 'object' ? data : null;
    } catch {
      showError(`The gateway sent a ${kind} event that is not JSON`);
      return null;
    }
  }

  function onStoreEvent(kind, event) {
    const data = eventData(kind, event);
    // Keys typed here are text; a key that is not UTF-8 is not one of ours.
    if (data === null || typeof data.key !== 'string') return;
    const entry = watched.get(data.key);
    if (!entry) return;

    entry.kind = kind;
    entry.at = new Date();
    entry.flags = [];
    switch (kind) {
      case 'sync':
        entry.exists = data.exists === true;
        entry.value = entry.exists ? data.value ?? null : null;
        // A resync repeats the value it already had: one point per change.
        if (entry.history.length === 0 || data.resync !== true) remember(entry, entry.value);
        entry.valueBase64 = entry.exists ? data.value_base64 ?? null : null;
        entry.omittedBytes = entry.exists && data.value_omitted === true ? data.value_bytes : null;
        entry.version = data.version ?? null;
        if (data.resync === true) entry.flags.push('resync');
        if (data.lagged === true) entry.flags.push('lagged');
        entry.error = null;
        break;
      case 'set':
        entry.exists = true;
        entry.value = data.value ?? null;
        remember(entry, entry.value);
        entry.valueBase64 = data.value_base64 ?? null;
        entry.omittedBytes = data.value_omitted === true ? data.value_bytes : null;
        entry.version = data.version ?? null;
        entry.error = null;
        break;
      case 'delete':
        entry.exists = false;
        entry.value = null;
        entry.valueBase64 = null;
        entry.omittedBytes = null;
        entry.version = data.version ?? null;
        entry.error = null;
        break;
      case 'error':
        entry.error = typeof data.error === 'string' ? data.error : 'the gateway cannot follow this key';
        break;
    }
    render(entry);
  }

  // ---- rows --------------------------------------------------------------

  function addRow(key) {
    const row = ui.template.content.firstElementChild.cloneNode(true);
    row.dataset.key = key;
    row.querySelector('.key').textContent = key;
    const input = row.querySelector('.set-value');
    input.setAttribute('aria-label', `New value for ${key}`);
    row.querySelector('.set').setAttribute('aria-label', `Set ${key}`);
    row.querySelector('.delete').setAttribute('aria-label', `Delete ${key} from the store`);
    row.querySelector('.remove').setAttribute('aria-label', `Stop watching ${key}`);

    row.querySelector('.set-form').addEventListener('submit', (event) => {
      event.preventDefault();
      setValue(key, input.value, row);
    });
    row.querySelector('.delete').addEventListener('click', () => deleteKey(key, row));
    row.querySelector('.remove').addEventListener('click', () => unwatch(key));

    const entry = {
      key, row, exists: null, value: null, valueBase64: null, omittedBytes: null, version: null,
      kind: null, flags: [], at: null, error: null, history: [], times: [],
    };
    watched.set(key, entry);
    ui.rows.append(row);
    render(entry);
    updateEmpty();
    return entry;
  }

  function render(entry) {
    const { row } = entry;
    const marker = row.querySelector('.value .marker');
    const text = row.querySelector('.value .text');
    row.dataset.exists = entry.exists === null ? 'unknown' : String(entry.exists);
    row.dataset.kind = entry.kind ?? '';
    const lock = locks.has(entry.key);
    row.classList.toggle('lock', lock);
    if (entry.exists === null) {
      marker.textContent = 'waiting for the store…';
      text.textContent = '';
    } else if (lock && !entry.exists) {
      marker.textContent = 'lock free';
      text.textContent = '';
    } else if (lock && typeof entry.value === 'string') {
      marker.textContent = 'held by';
      text.textContent = entry.value;
    } else if (!entry.exists) {
      marker.textContent = 'absent';
      text.textContent = '';
    } else if (typeof entry.value === 'string') {
      marker.textContent = entry.value === '' ? 'empty' : '';
      text.textContent = entry.value;
    } else if (typeof entry.valueBase64 === 'string') {
      marker.textContent = 'not UTF-8, base64:';
      text.textContent = entry.valueBase64;
    } else if (typeof entry.omittedBytes === 'number') {
      // Too large for events: GET /keys/{key} reads it.
      marker.textContent = `${entry.omittedBytes} bytes, too large to show`;
      text.textContent = '';
    } else {
      marker.textContent = 'value unknown';
      text.textContent = '';
    }
    marker.hidden = marker.textContent === '';

    // A lock's version is its holder's fencing token.
    const version = entry.version ?? '—';
    row.querySelector('.version').textContent = lock && entry.exists ? `fencing token ${version}` : version;
    renderSpark(entry);

    const kind = row.querySelector('.event .kind');
    const time = row.querySelector('.event .time');
    kind.textContent = entry.kind === null ? '—' : [entry.kind, ...entry.flags].join(', ');
    if (entry.at) {
      time.dateTime = entry.at.toISOString();
      time.textContent = formatTime(entry.at);
    }
    const error = row.querySelector('.event .event-error');
    error.textContent = entry.error ? entry.error : '';
    error.hidden = !entry.error;
    row.classList.toggle('has-error', Boolean(entry.error));
  }

  // ---- sparklines --------------------------------------------------------

  /** A plain decimal number (what sensors write), or null. */
  function numeric(value) {
    if (typeof value !== 'string' || !/^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$/.test(value)) return null;
    const number = Number(value);
    return Number.isFinite(number) ? number : null;
  }

  /**
   * Keeps the numeric values seen since the page opened, with the time of
   * each (bounded: the oldest go first).
   */
  function remember(entry, value, at = Date.now(), limit = SPARK_POINTS) {
    const number = numeric(value);
    if (number === null) return;
    entry.history.push(number);
    entry.times.push(at);
    if (entry.history.length > limit) {
      entry.history.shift();
      entry.times.shift();
    }
  }

  function renderSpark(entry) {
    drawSpark(entry.row.querySelector('.spark'), entry.key, entry.history);
  }

  /** An inline SVG polyline of the last values: attributes only, no inline style (CSP). */
  function drawSpark(svg, label, history) {
    const points = history.length > SPARK_POINTS ? history.slice(-SPARK_POINTS) : history;
    // An SVG element has no `hidden` property: the attribute it is.
    svg.toggleAttribute('hidden', points.length < 2);
    if (points.length < 2) return;
    const low = Math.min(...points);
    const high = Math.max(...points);
    const span = high - low || 1;
    const step = 100 / (points.length - 1);
    const coordinates = points.map((value, index) => {
      const x = (index * step).toFixed(2);
      const y = (18 - ((value - low) / span) * 16).toFixed(2);
      return `${x},${y}`;
    });
    svg.querySelector('polyline').setAttribute('points', coordinates.join(' '));
    svg.setAttribute('aria-label', `${label}: ${points.length} values since the page opened, from ${low} to ${high}`);
    let title = svg.querySelector('title');
    if (!title) {
      title = document.createElementNS(SVG_NS, 'title');
      svg.prepend(title);
    }
    title.textContent = `last ${points.length} values: ${points.join(', ')}`;
  }

  // ---- key browser --------------------------------------------------------

  let browsing = { pattern: '*', next: null, generation: 0 };

  function listUrl(pattern, cursor) {
    const query = [`match=${encodeURIComponent(pattern)}`, `limit=${BROWSE_PAGE}`];
    if (cursor) query.push(`cursor=${encodeURIComponent(cursor)}`);
    return new URL('keys?' + query.join('&'), API_ROOT);
  }

  /** Lists the first page for `pattern` (replacing the list) or the next one. */
  async function browse(pattern, more) {
    if (!more) {
      browsing = { pattern, next: null, generation: browsing.generation + 1 };
      ui.browseList.replaceChildren();
    }
    const mine = browsing.generation;
    ui.browseMore.hidden = true;
    ui.browseStatus.textContent = 'Listing…';
    let response;
    try {
      response = await request('GET', listUrl(pattern, more ? browsing.next : null));
    } catch (err) {
      ui.browseStatus.textContent = '';
      showError(`Listing failed: ${err.message}`);
      return;
    }
    if (mine !== browsing.generation) return; // a newer listing started
    if (response.status === 401) {
      ui.browseStatus.textContent = 'Listing keys needs the API token (below)';
      return;
    }
    if (!response.ok) {
      ui.browseStatus.textContent = '';
      showError(`Listing ${pattern} failed: ${await describeFailure(response)}`);
      return;
    }
    let page;
    try {
      page = await response.json();
    } catch {
      ui.browseStatus.textContent = '';
      showError('The gateway sent a listing that is not JSON');
      return;
    }
    if (mine !== browsing.generation) return;
    for (const entry of Array.isArray(page.keys) ? page.keys : []) addListed(entry);
    browsing.next = typeof page.next === 'string' ? page.next : null;
    ui.browseMore.hidden = browsing.next === null;
    const shown = ui.browseList.childElementCount;
    ui.browseStatus.textContent = shown === 0 && browsing.next === null
      ? `No keys match ${pattern}`
      : `${shown} key${shown === 1 ? '' : 's'} matching ${pattern}${browsing.next ? ', more to list' : ''}`;
  }

  function addListed(entry) {
    const item = document.createElement('li');
    if (typeof entry.key === 'string') {
      const button = document.createElement('button');
      button.type = 'button';
      button.textContent = entry.key;
      button.dataset.key = entry.key;
      button.dataset.watched = String(watched.has(entry.key));
      button.setAttribute('aria-label', `Watch ${entry.key}`);
      button.addEventListener('click', () => {
        if (!watched.has(entry.key)) watch(entry.key);
        button.dataset.watched = 'true';
      });
      item.append(button);
    } else {
      // This page watches text keys; the bytes are shown, not watched.
      const span = document.createElement('span');
      span.className = 'binary';
      span.textContent = `(not UTF-8) ${entry.key_base64 ?? ''}`;
      item.append(span);
    }
    ui.browseList.append(item);
  }

  // ---- following a key space ----------------------------------------------
  //
  // One `/watch?match=<glob>` stream: a `sync` per matching key, `listed`
  // when the picture is whole, then `set`/`delete` as keys change, appear
  // and go. Events only update the model and mark keys dirty; the table is
  // updated once per animation frame for the keys that changed, so a burst
  // over a thousand keys costs one pass, not one per event.

  const follow = {
    pattern: null,
    stream: newStream(),
    epoch: 0, // counts opens: a key not synced since the latest one is gone once `listed` comes
    listed: false,
    startedAt: 0,
    entries: new Map(), // id -> entry (a key's text, or its base64 when it is not UTF-8)
    order: [], // the entries that have a row, sorted by id as the rows are
    dirty: new Set(), // entries to render in the next frame
    frame: 0,
    sweepTimer: null,
    selected: null, // id of the key whose chart is shown
    chartTimer: null,
  };
  const rowEntries = new WeakMap(); // followed row -> its entry

  function followUrl(pattern) {
    const query = ['match=' + encodeURIComponent(pattern)];
    const token = apiToken();
    if (token) query.push('access_token=' + encodeURIComponent(token));
    return new URL('watch?' + query.join('&'), API_ROOT);
  }

  function setFollowConnection(state, text) {
    ui.followConnection.dataset.state = state;
    ui.followText.textContent = text;
    ui.followTable.classList.toggle('stale', state !== 'live');
  }

  function startFollowing(pattern) {
    // The kept pattern is replaced, never dropped on the way: a tab that
    // starts meanwhile reads it.
    clearFollowing();
    follow.pattern = pattern;
    follow.startedAt = Date.now();
    ui.followPattern.textContent = pattern;
    ui.follow.hidden = false;
    saveFollowed();
    openFollowStream();
    // The section's heading names the pattern: no notice repeats it.
    renderFollowStatus();
  }

  function stopFollowing() {
    clearFollowing();
    saveFollowed();
  }

  /** Stops following, without changing the pattern kept for the next visit. */
  function clearFollowing() {
    closeStream(follow.stream);
    follow.stream.generation += 1;
    clearTimeout(follow.sweepTimer);
    follow.sweepTimer = null;
    if (follow.frame) cancelAnimationFrame(follow.frame);
    follow.frame = 0;
    follow.pattern = null;
    follow.listed = false;
    follow.entries.clear();
    follow.order = [];
    follow.dirty.clear();
    ui.followRows.replaceChildren();
    select(null);
    ui.follow.hidden = true;
    setFollowConnection('idle', 'Not following');
  }

  function saveFollowed() {
    try {
      if (follow.pattern === null) localStorage.removeItem(FOLLOW_KEY);
      else localStorage.setItem(FOLLOW_KEY, follow.pattern);
    } catch {
      // Only the next visit forgets the pattern.
    }
  }

  function openFollowStream() {
    const pattern = follow.pattern;
    openEventSource(follow.stream, followUrl(pattern), ['sync', 'set', 'delete', 'listed'], 'follow', {
      failure: `Following ${pattern} failed`,
      refusedText: 'Not following: change the pattern',
      open: () => {
        follow.epoch += 1;
        follow.listed = false;
        setFollowConnection('connecting', 'Listing the keys…');
      },
      event: onFollowEvent,
      state: (state, text) => setFollowConnection(state, text.replace('Not connected', 'Not following')),
      reopen: openFollowStream,
    });
  }

  /** The entry id of an event's key: its text, or its bytes when they are not UTF-8. */
  function keyId(data) {
    if (typeof data.key === 'string') return data.key;
    if (typeof data.key_base64 === 'string') return `\u0000${data.key_base64}`;
    return null;
  }

  /** The wall clock of a version (a hybrid logical clock, `<ms>:<counter>:<node>`), if plausible. */
  function versionTime(version) {
    const match = typeof version === 'string' ? /^(\d{1,16}):/.exec(version) : null;
    if (!match) return null;
    const ms = Number(match[1]);
    return ms > 1e12 && ms < Date.now() + 86_400_000 ? ms : null;
  }

  function onFollowEvent(kind, event) {
    const data = eventData(kind, event);
    if (data === null) return;
    if (kind === 'listed') {
      if (data.match !== follow.pattern) return;
      follow.listed = true;
      // Keys gone while the stream was down got no delete: they were not
      // synced since it opened again.
      for (const entry of follow.entries.values()) {
        if (entry.seen !== follow.epoch) leave(entry, null);
      }
      setFollowConnection('live', 'Live');
      scheduleFlush();
      return;
    }
    const id = keyId(data);
    const entry = id === null ? undefined : follow.entries.get(id);
    if (kind === 'error') {
      const message = typeof data.error === 'string' ? data.error : 'the gateway cannot follow this pattern';
      if (entry) {
        entry.error = message;
        markDirty(entry);
      } else {
        showError(`Following ${follow.pattern}: ${message}`, 'follow');
      }
      return;
    }
    if (id === null) return;
    if (kind === 'delete' || (kind === 'sync' && data.exists !== true)) {
      if (entry) leave(entry, data.version ?? null);
      return;
    }
    arrive(kind, id, entry, data);
  }

  /** A key that exists: new, changed, or synced again after a reconnect. */
  function arrive(kind, id, known, data) {
    let entry = known;
    if (!entry) {
      entry = {
        id, label: id.startsWith('\u0000') ? `(not UTF-8) ${id.slice(1)}` : id,
        value: null, valueBase64: null, omittedBytes: null, version: undefined, at: 0, seen: 0, gone: 0,
        flash: false, error: null, history: [], times: [], row: null, cells: null,
      };
      follow.entries.set(id, entry);
    }
    entry.seen = follow.epoch;
    entry.error = null;
    const version = data.version ?? null;
    const returning = entry.gone !== 0;
    entry.gone = 0;
    // A reconnect syncs every key again: one that did not change stays as it is.
    if (kind === 'sync' && version === entry.version && !returning) {
      markDirty(entry);
      return;
    }
    // The first sight of a key in the initial listing is not a change.
    entry.flash = entry.flash || kind !== 'sync' || follow.listed || known !== undefined;
    entry.value = data.value ?? null;
    entry.valueBase64 = data.value_base64 ?? null;
    // Values too large for events come as their length only.
    entry.omittedBytes = data.value_omitted === true ? data.value_bytes : null;
    entry.version = version;
    entry.at = versionTime(version) ?? Date.now();
    remember(entry, entry.value, entry.at, CHART_POINTS);
    markDirty(entry);
  }

  /** A key that is gone: its row says so for a moment, then leaves. */
  function leave(entry, version) {
    if (entry.gone !== 0) return;
    entry.gone = performance.now();
    entry.flash = true;
    if (version !== null) entry.version = version;
    entry.at = versionTime(version) ?? Date.now();
    markDirty(entry);
    if (follow.sweepTimer === null) follow.sweepTimer = setTimeout(sweep, LEAVE_MS);
  }

  function sweep() {
    follow.sweepTimer = null;
    const now = performance.now();
    let next = Infinity;
    for (const entry of follow.entries.values()) {
      if (entry.gone === 0) continue;
      if (now - entry.gone >= LEAVE_MS) {
        follow.entries.delete(entry.id);
        markDirty(entry);
      } else {
        next = Math.min(next, entry.gone + LEAVE_MS - now);
      }
    }
    if (next !== Infinity) follow.sweepTimer = setTimeout(sweep, next);
  }

  function markDirty(entry) {
    follow.dirty.add(entry);
    scheduleFlush();
  }

  function scheduleFlush() {
    if (follow.frame === 0) follow.frame = requestAnimationFrame(flushFollowed);
  }

  /** Renders what changed since the last frame: rows in, rows out, cells. */
  function flushFollowed() {
    follow.frame = 0;
    let chart = false;
    for (const entry of follow.dirty) {
      if (follow.entries.get(entry.id) !== entry) {
        removeFollowedRow(entry);
      } else {
        if (entry.row === null) insertFollowedRow(entry);
        renderFollowed(entry);
      }
      chart ||= entry.id === follow.selected;
    }
    follow.dirty.clear();
    renderFollowStatus();
    if (chart) renderChart();
  }

  /** Inserts the entry's row at its sorted place. */
  function insertFollowedRow(entry) {
    const row = ui.followTemplate.content.firstElementChild.cloneNode(true);
    const cells = {
      select: row.querySelector('.select'),
      marker: row.querySelector('.value .marker'),
      text: row.querySelector('.value .text'),
      spark: row.querySelector('.spark'),
      version: row.querySelector('.version'),
      time: row.querySelector('.changed .time'),
      error: row.querySelector('.changed .event-error'),
    };
    row.dataset.key = entry.label;
    cells.select.textContent = entry.label;
    entry.row = row;
    entry.cells = cells;
    rowEntries.set(row, entry);
    const { order } = follow;
    let low = 0;
    let high = order.length;
    while (low < high) {
      const middle = (low + high) >>> 1;
      if (order[middle].id < entry.id) low = middle + 1;
      else high = middle;
    }
    order.splice(low, 0, entry);
    ui.followRows.insertBefore(row, order[low + 1]?.row ?? null);
  }

  function removeFollowedRow(entry) {
    if (entry.row === null) return;
    const index = follow.order.indexOf(entry);
    if (index !== -1) follow.order.splice(index, 1);
    entry.row.remove();
    entry.row = null;
    if (follow.selected === entry.id && !follow.entries.has(entry.id)) select(null);
  }

  function setText(node, text) {
    if (node.textContent !== text) node.textContent = text;
  }

  function renderFollowed(entry) {
    const { row, cells } = entry;
    row.dataset.exists = String(entry.gone === 0);
    let marker = '';
    let text = '';
    if (entry.gone !== 0) {
      marker = 'deleted';
    } else if (typeof entry.value === 'string') {
      marker = entry.value === '' ? 'empty' : '';
      text = entry.value;
    } else if (typeof entry.valueBase64 === 'string') {
      marker = 'not UTF-8, base64:';
      text = entry.valueBase64;
    } else if (typeof entry.omittedBytes === 'number') {
      marker = `${entry.omittedBytes} bytes, too large to show`;
    }
    // A huge value would cost layout for nothing: the start is enough here.
    if (text.length > VALUE_SHOWN) text = `${text.slice(0, VALUE_SHOWN)}…`;
    setText(cells.marker, marker);
    cells.marker.hidden = marker === '';
    setText(cells.text, text);
    setText(cells.version, entry.version ?? '—');
    const at = new Date(entry.at);
    cells.time.dateTime = at.toISOString();
    setText(cells.time, formatTime(at));
    setText(cells.error, entry.error ?? '');
    cells.error.hidden = !entry.error;
    row.classList.toggle('has-error', Boolean(entry.error));
    drawSpark(cells.spark, entry.label, entry.history);
    if (entry.flash) {
      // Two identical animations under two names: switching restarts it
      // without forcing a layout.
      row.dataset.flash = row.dataset.flash === 'a' ? 'b' : 'a';
      entry.flash = false;
    }
  }

  function renderFollowStatus() {
    let n = 0;
    for (const entry of follow.entries.values()) if (entry.gone === 0) n += 1;
    const keys = `${n} key${n === 1 ? '' : 's'}`;
    // A live region: only a new count is announced.
    setText(ui.followCount, follow.listed ? `${keys} matching` : `${keys} listed so far`);
    ui.followEmpty.hidden = follow.order.length > 0;
    ui.followTable.hidden = follow.order.length === 0;
  }

  const TIME_OF_DAY = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit', hourCycle: 'h23' });
  const HOUR_MINUTE = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit', hourCycle: 'h23' });
  const DAY = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium' });

  /** The time of day, with the date when it is not today. */
  function formatTime(at) {
    const time = TIME_OF_DAY.format(at);
    return at.toDateString() === new Date().toDateString() ? time : `${DAY.format(at)} ${time}`;
  }

  // ---- a followed MQTT topic -----------------------------------------------
  //
  // One `/subscribe?topic=<filter>` stream: `subscribed` once the gateway
  // follows the filter, then a `message` per message published on a
  // matching topic (by MQTT clients or the Dapr publish route), `lagged`
  // when the stream fell behind. Messages are not state: the page keeps the
  // latest ones, a tab opened later sees only those that come after.

  const topics = { filter: null, stream: newStream() };

  function subscribeUrl(filter) {
    const query = ['topic=' + encodeURIComponent(filter)];
    const token = apiToken();
    if (token) query.push('access_token=' + encodeURIComponent(token));
    return new URL('subscribe?' + query.join('&'), API_ROOT);
  }

  function setTopicConnection(state, text) {
    ui.topicConnection.dataset.state = state;
    ui.topicText.textContent = text;
    ui.topicTable.classList.toggle('stale', state !== 'live');
  }

  function followTopic(filter) {
    stopTopic();
    topics.filter = filter;
    ui.topicFollowed.textContent = filter;
    ui.topicFilter.value = filter;
    ui.topicStop.disabled = false;
    saveTopic();
    ui.topicBox.hidden = false;
    renderTopicEmpty();
    openTopicStream();
  }

  function stopTopic() {
    closeStream(topics.stream);
    topics.stream.generation += 1;
    topics.filter = null;
    ui.topicRows.replaceChildren();
    ui.topicBox.hidden = true;
    ui.topicStop.disabled = true;
    setText(ui.topicNotice, '');
    setTopicConnection('idle', 'Not following a topic');
  }

  function saveTopic() {
    try {
      if (topics.filter === null) localStorage.removeItem(TOPIC_KEY);
      else localStorage.setItem(TOPIC_KEY, topics.filter);
    } catch {
      // Only the next visit forgets the filter.
    }
  }

  function openTopicStream() {
    const filter = topics.filter;
    openEventSource(topics.stream, subscribeUrl(filter), ['subscribed', 'message', 'lagged'], 'topic', {
      failure: `Following the topic ${filter} failed`,
      refusedText: 'Not following: change the topic filter',
      open: () => setTopicConnection('connecting', 'Subscribing…'),
      event: onTopicEvent,
      state: (state, text) => setTopicConnection(state, text.replace('Not connected', 'Not following')),
      reopen: openTopicStream,
    });
  }

  function onTopicEvent(kind, event) {
    const data = eventData(kind, event);
    if (data === null) return;
    switch (kind) {
      case 'subscribed':
        setTopicConnection('live', `Live: following ${topics.filter}`);
        break;
      case 'message':
        if (typeof data.topic === 'string' && typeof data.payload === 'string') addMessage(data);
        break;
      case 'lagged': {
        const n = Number(data.skipped) || 0;
        setText(ui.topicNotice, `The page fell behind: ${n} message${n === 1 ? '' : 's'} missed`);
        break;
      }
      case 'error':
        showError(`Following the topic ${topics.filter}: ${typeof data.error === 'string' ? data.error : 'the gateway failed'}`, 'topic');
        break;
    }
  }

  /** A message as the newest row; the oldest beyond the bound leave. */
  function addMessage(data) {
    const row = ui.topicTemplate.content.firstElementChild.cloneNode(true);
    const at = new Date();
    const time = row.querySelector('.time');
    time.dateTime = at.toISOString();
    time.textContent = formatTime(at);
    row.querySelector('.topic').textContent = data.topic;
    row.dataset.topic = data.topic;
    const type = typeof data.contentType === 'string' && data.contentType !== '' ? data.contentType : '—';
    row.querySelector('.content-type').textContent = type;
    const marker = row.querySelector('.marker');
    const text = row.querySelector('.text');
    if (data.encoding === 'base64') marker.textContent = 'not UTF-8, base64:';
    else if (data.payload === '') marker.textContent = 'empty';
    marker.hidden = marker.textContent === '';
    const { payload } = data;
    if (payload.length > PAYLOAD_SHOWN) {
      text.textContent = `${payload.slice(0, PAYLOAD_SHOWN)}…`;
      text.title = payload;
    } else {
      text.textContent = payload;
    }
    row.dataset.flash = 'a';
    ui.topicRows.prepend(row);
    while (ui.topicRows.children.length > MESSAGES_SHOWN) ui.topicRows.lastElementChild.remove();
    renderTopicEmpty();
  }

  function renderTopicEmpty() {
    const none = ui.topicRows.children.length === 0;
    ui.topicEmpty.hidden = !none;
    ui.topicTable.hidden = none;
  }

  // ---- the selected key's chart -------------------------------------------

  function select(id) {
    const previous = follow.selected === null ? undefined : follow.entries.get(follow.selected);
    if (previous?.row) {
      previous.row.classList.remove('selected');
      previous.cells.select.setAttribute('aria-pressed', 'false');
    }
    follow.selected = id;
    const entry = id === null ? undefined : follow.entries.get(id);
    if (entry?.row) {
      entry.row.classList.add('selected');
      entry.cells.select.setAttribute('aria-pressed', 'true');
    }
    clearInterval(follow.chartTimer);
    // The time axis runs on to now while a key is shown.
    follow.chartTimer = entry ? setInterval(renderChart, CHART_TICK_MS) : null;
    renderChart();
  }

  function svgElement(name, attributes, text) {
    const element = document.createElementNS(SVG_NS, name);
    for (const [attribute, value] of Object.entries(attributes)) element.setAttribute(attribute, String(value));
    if (text !== undefined) element.textContent = text;
    return element;
  }

  /** Steps of the time axis: the first that gives at most six ticks. */
  const TIME_STEPS_S = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];

  function formatNumber(value) {
    return String(Number(value.toPrecision(6)));
  }

  /**
   * Round ticks over [low, high]: a step of 1, 2 or 5 times a power of ten
   * giving at most six ticks, each written with the step's decimals.
   */
  function valueTicks(low, high) {
    if (low === high) return [{ value: low, label: formatNumber(low) }];
    const rough = (high - low) / 5;
    const power = 10 ** Math.floor(Math.log10(rough));
    const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= rough);
    const decimals = Math.max(0, -Math.floor(Math.log10(step)));
    const ticks = [];
    for (let i = Math.ceil(low / step); i * step <= high; i += 1) {
      const value = i * step;
      ticks.push({ value, label: (Object.is(value, -0) ? 0 : value).toFixed(decimals) });
    }
    return ticks;
  }

  /**
   * The selected key's numeric values against time, as steps (a value holds
   * until the next change), from when following began (or its first value
   * since) to now.
   */
  function renderChart() {
    const entry = follow.selected === null ? undefined : follow.entries.get(follow.selected);
    ui.chart.hidden = !entry;
    if (!entry) return;
    const svg = ui.chartSvg;
    const [grid, yAxis, xAxis, line, points] = ['.grid', '.y-axis', '.x-axis', '.line', '.points'].map((s) => svg.querySelector(s));
    setText(ui.chartKey, entry.label);
    const { history: values, times } = entry;
    if (values.length === 0) {
      setText(ui.chartNote, 'has no numeric value to chart since following began');
      for (const group of [grid, yAxis, xAxis, points]) group.replaceChildren();
      line.setAttribute('d', '');
      return;
    }
    const [width, height] = [1000, 220];
    const [left, right, top, bottom] = [64, 12, 10, 24];
    const now = Math.max(Date.now(), times[times.length - 1]);
    const start = Math.min(Math.max(times[0], follow.startedAt), now - CHART_MIN_SPAN_MS);
    const low0 = Math.min(...values);
    const high0 = Math.max(...values);
    const pad = (high0 - low0) * 0.08 || Math.abs(high0) * 0.05 || 1;
    const [low, high] = [low0 - pad, high0 + pad];
    const x = (t) => left + ((Math.min(Math.max(t, start), now) - start) / (now - start)) * (width - left - right);
    const y = (v) => top + ((high - v) / (high - low)) * (height - top - bottom);

    const gridLines = [];
    const yLabels = [];
    for (const { value, label } of valueTicks(low, high)) {
      gridLines.push(svgElement('line', { x1: left, x2: width - right, y1: y(value), y2: y(value) }));
      yLabels.push(svgElement('text', { x: left - 6, y: y(value), 'text-anchor': 'end', 'dominant-baseline': 'middle' }, label));
    }
    const span = (now - start) / 1000;
    const stepS = TIME_STEPS_S.find((s) => span / s <= 6) ?? 86400;
    const step = stepS * 1000;
    const format = stepS < 60 ? TIME_OF_DAY : HOUR_MINUTE;
    const xLabels = [];
    for (let t = Math.ceil(start / step) * step; t <= now; t += step) {
      gridLines.push(svgElement('line', { x1: x(t), x2: x(t), y1: top, y2: height - bottom }));
      // The last label would stick out on the right: it ends at its tick.
      const anchor = x(t) > width - right - 30 ? 'end' : 'middle';
      xLabels.push(svgElement('text', { x: x(t), y: height - 6, 'text-anchor': anchor }, format.format(t)));
    }
    xLabels.push(svgElement('line', { x1: left, x2: width - right, y1: height - bottom, y2: height - bottom }));
    grid.replaceChildren(...gridLines);
    yAxis.replaceChildren(...yLabels);
    xAxis.replaceChildren(...xLabels);

    let d = `M${x(times[0]).toFixed(1)},${y(values[0]).toFixed(1)}`;
    const dots = [];
    for (let i = 0; i < values.length; i += 1) {
      if (i > 0) d += `H${x(times[i]).toFixed(1)}V${y(values[i]).toFixed(1)}`;
      dots.push(svgElement('circle', { cx: x(times[i]).toFixed(1), cy: y(values[i]).toFixed(1), r: 2.5 }));
    }
    d += `H${x(entry.gone === 0 ? now : times[times.length - 1]).toFixed(1)}`;
    line.setAttribute('d', d);
    points.replaceChildren(...dots);
    const last = values[values.length - 1];
    setText(ui.chartNote, `${values.length} value${values.length === 1 ? '' : 's'} from ${formatNumber(low0)} to ${formatNumber(high0)}, now ${formatNumber(last)}`);
    svg.setAttribute('aria-label', `${entry.label}: ${values.length} values against time, from ${formatNumber(low0)} to ${formatNumber(high0)}, the latest ${formatNumber(last)}`);
  }

  function updateEmpty() {
    const none = watched.size === 0;
    ui.table.hidden = none;
    ui.empty.hidden = !none;
  }

  // ---- actions -----------------------------------------------------------

  function watch(key) {
    if (key === '') {
      showError('Type a key to watch');
      return false;
    }
    if (!encodable(key)) {
      showError('That key contains a character that cannot be sent in a URL');
      return false;
    }
    if (watched.has(key)) {
      showNotice(`${key} is already watched`);
      watched.get(key).row.querySelector('.set-value').focus();
      return false;
    }
    addRow(key);
    saveKeys();
    openStream();
    showNotice(`Watching ${key}`);
    return true;
  }

  function unwatch(key) {
    const entry = watched.get(key);
    if (!entry) return;
    entry.row.remove();
    watched.delete(key);
    locks.delete(key);
    for (const button of ui.browseList.querySelectorAll('button')) {
      if (button.dataset.key === key) button.dataset.watched = 'false';
    }
    saveKeys();
    updateEmpty();
    openStream();
    showNotice(`Stopped watching ${key}`);
    ui.addKey.focus();
  }

  async function busy(row, work) {
    row.setAttribute('aria-busy', 'true');
    for (const button of row.querySelectorAll('button')) button.disabled = true;
    try {
      await work();
    } catch (err) {
      showError(err.message);
    } finally {
      row.removeAttribute('aria-busy');
      for (const button of row.querySelectorAll('button')) button.disabled = false;
    }
  }

  function setValue(key, value, row) {
    return busy(row, async () => {
      const response = await request('PUT', keyUrl(key), value);
      if (!response.ok) throw new Error(`Setting ${key} failed: ${await describeFailure(response)}`);
      let version = '';
      try {
        version = (await response.json()).version || '';
      } catch {
        // the value is set; only the version is unknown
      }
      row.querySelector('.set-value').value = '';
      showNotice(version ? `Set ${key} (version ${version})` : `Set ${key}`);
    });
  }

  function deleteKey(key, row) {
    return busy(row, async () => {
      const response = await request('DELETE', keyUrl(key));
      if (response.status === 404) {
        showNotice(`${key} was already absent`);
      } else if (response.ok) {
        showNotice(`Deleted ${key}`);
      } else {
        throw new Error(`Deleting ${key} failed: ${await describeFailure(response)}`);
      }
    });
  }

  // ---- start -------------------------------------------------------------

  ui.addForm.addEventListener('submit', (event) => {
    event.preventDefault();
    const key = ui.addKey.value;
    if (ui.addLock.checked && !watched.has(key)) locks.add(key);
    if (watch(key)) {
      ui.addKey.value = '';
      ui.addLock.checked = false;
    } else if (!watched.has(key)) {
      locks.delete(key);
    }
  });

  ui.browseForm.addEventListener('submit', (event) => {
    event.preventDefault();
    const pattern = ui.browsePattern.value || '*';
    browse(pattern, false);
  });

  ui.browseMore.addEventListener('click', () => browse(browsing.pattern, true));

  ui.followStart.addEventListener('click', () => {
    const pattern = ui.browsePattern.value || '*';
    if (pattern === follow.pattern) showNotice(`Already following ${pattern}`);
    else startFollowing(pattern);
  });
  ui.followStop.addEventListener('click', () => {
    const pattern = follow.pattern;
    stopFollowing();
    showNotice(`Stopped following ${pattern}`);
  });
  // One listener for every row: a click on a key shows (or hides) its chart.
  ui.followRows.addEventListener('click', (event) => {
    const button = event.target.closest('button.select');
    const entry = button && rowEntries.get(button.closest('tr'));
    if (entry) select(follow.selected === entry.id ? null : entry.id);
  });

  ui.topicForm.addEventListener('submit', (event) => {
    event.preventDefault();
    const filter = ui.topicFilter.value;
    if (filter === '') {
      showError('Type a topic filter to follow, e.g. orders/#');
      return;
    }
    if (!encodable(filter)) {
      showError('That topic filter contains a character that cannot be sent in a URL');
      return;
    }
    followTopic(filter);
  });
  ui.topicStop.addEventListener('click', () => {
    const filter = topics.filter;
    stopTopic();
    saveTopic();
    if (filter !== null) showNotice(`Stopped following the topic ${filter}`);
    ui.topicFilter.focus();
  });

  ui.tokenForm.addEventListener('submit', (event) => {
    event.preventDefault();
    try {
      if (ui.token.value) {
        sessionStorage.setItem(TOKEN_KEY, ui.token.value);
      } else {
        sessionStorage.removeItem(TOKEN_KEY);
      }
    } catch {
      showError('This browser does not let the page keep the token');
      return;
    }
    ui.token.value = '';
    ui.tokenBox.open = false;
    showNotice(apiToken() ? 'Using the API token' : 'No API token');
    openStream();
    if (follow.pattern !== null) openFollowStream();
    if (topics.filter !== null) openTopicStream();
    browse(browsing.pattern, false);
  });

  for (const key of loadKeys()) addRow(key);
  updateEmpty();
  openStream();
  try {
    const pattern = localStorage.getItem(FOLLOW_KEY);
    if (pattern) {
      ui.browsePattern.value = pattern;
      startFollowing(pattern);
    }
    const filter = localStorage.getItem(TOPIC_KEY);
    if (filter && encodable(filter)) followTopic(filter);
  } catch {
    // no storage: nothing was followed
  }
  // The first page of every key, so the page does not open empty.
  browse('*', false);
})();
