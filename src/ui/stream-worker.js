// The dashboard's event streams, shared by every tab of one gateway (a
// SharedWorker): one EventSource per distinct stream URL, however many tabs
// show it. Browsers allow six HTTP/1.1 connections per origin; with a
// stream or two per tab, the fourth tab would wait for ever.
//
// A tab (app.js) subscribes to a URL through its port and hears what an
// EventSource of its own would have told it: `open`, every event (type,
// data, lastEventId), reconnecting, closed. A tab that joins a stream
// already open first gets the stream's current picture, as a fresh stream
// starts: `open`, a `sync` per key of its latest state, the patterns'
// `listed`, a topic stream's `subscribed`. A topic's messages (and
// `lagged`) are forwarded, never kept: a tab hears those that come after
// it joined. The EventSource reconnects by itself, with Last-Event-ID.
'use strict';

// The event types the gateway sends (docs/api.md): /watch's, then /subscribe's.
const KINDS = ['sync', 'set', 'delete', 'error', 'listed', 'subscribed', 'message', 'lagged'];
// Tabs that hold no Web Lock (an insecure context) are known alive by their
// pings; a hidden tab's timers may run only once a minute, hence generous.
const SILENT_MS = 150_000;
const SWEEP_MS = 30_000;

/** url -> its shared stream. */
const streams = new Map();
/** port -> { subscriptions: Map<id, stream>, lock: AbortController | null, heard: ms } */
const tabs = new Map();
/** Ports of tabs that left or went silent: told to start again if they speak. */
const dropped = new WeakSet();
/** port -> messages not yet sent. */
const outbox = new Map();
let flushTimer = null;

self.addEventListener('connect', (event) => {
  const port = event.ports[0];
  port.addEventListener('message', (message) => receive(port, message.data));
  port.start();
});

setInterval(sweepSilentTabs, SWEEP_MS);

function receive(port, message) {
  if (message?.type === 'hello') {
    dropped.delete(port);
  } else if (dropped.has(port)) {
    // Dropped while it lived (back from the back/forward cache, or after a
    // long freeze): it says hello and subscribes again, for a whole picture.
    send(port, { type: 'expired' });
    return;
  }
  const tab = tabOf(port);
  tab.heard = Date.now();
  switch (message?.type) {
    case 'lock':
      watchLock(port, tab, message.name);
      break;
    case 'subscribe':
      subscribe(port, tab, message.id, message.url);
      break;
    case 'unsubscribe':
      unsubscribe(port, tab, message.id);
      break;
    case 'leave':
      dropTab(port);
      break;
    // 'hello' and 'ping' only mark the tab alive, above.
  }
}

function tabOf(port) {
  let tab = tabs.get(port);
  if (!tab) {
    tab = { subscriptions: new Map(), lock: null, heard: Date.now() };
    tabs.set(port, tab);
  }
  return tab;
}

/**
 * The tab holds the Web Lock `name` for as long as it lives: once this
 * worker gets it, the tab is gone (closed, crashed, killed), said so or not.
 */
function watchLock(port, tab, name) {
  if (!self.navigator.locks || typeof name !== 'string' || tab.lock) return;
  tab.lock = new AbortController();
  self.navigator.locks
    .request(name, { signal: tab.lock.signal }, () => dropTab(port))
    .catch(() => {}); // aborted: the tab left first
}

function sweepSilentTabs() {
  const now = Date.now();
  for (const [port, tab] of tabs) {
    if (tab.lock === null && now - tab.heard > SILENT_MS) dropTab(port);
  }
}

function dropTab(port) {
  const tab = tabs.get(port);
  if (!tab) return;
  for (const id of [...tab.subscriptions.keys()]) unsubscribe(port, tab, id);
  tab.lock?.abort();
  tabs.delete(port);
  outbox.delete(port);
  dropped.add(port);
}

function subscribe(port, tab, id, url) {
  if (typeof url !== 'string') return;
  // Subscribing again (a tab starting over) asks for the picture again.
  unsubscribe(port, tab, id);
  let stream = streams.get(url);
  const joining = stream !== undefined;
  if (!joining) stream = openStream(url);
  if (!stream.subscribers.has(port)) stream.subscribers.set(port, new Set());
  stream.subscribers.get(port).add(id);
  tab.subscriptions.set(id, stream);
  if (joining) replay(stream, port, id);
}

function unsubscribe(port, tab, id) {
  const stream = tab.subscriptions.get(id);
  if (!stream) return;
  tab.subscriptions.delete(id);
  const ids = stream.subscribers.get(port);
  ids?.delete(id);
  if (ids?.size === 0) stream.subscribers.delete(port);
  if (stream.subscribers.size === 0) closeStream(stream);
}

// ---- a shared stream ------------------------------------------------------

/**
 * The stream's picture is what a tab joining late needs: each key's latest
 * state (and error), each pattern's `listed` and error, a topic stream's
 * `subscribed`. `epoch` counts
 * opens: after a reconnect the gateway lists the patterns again, and a key
 * not synced again by then is gone.
 */
function openStream(url) {
  const stream = {
    url,
    source: new EventSource(url),
    subscribers: new Map(), // port -> its subscription ids
    named: namedKeys(url),
    keys: new Map(), // key id -> { state, error, epoch }
    patterns: new Map(), // kind + pattern -> its latest event of that kind
    epoch: 0,
    opened: false,
  };
  streams.set(url, stream);
  const { source } = stream;
  source.addEventListener('open', () => {
    stream.epoch += 1;
    stream.opened = true;
    stream.patterns.clear();
    broadcast(stream, { type: 'open' });
  });
  for (const kind of KINDS) {
    source.addEventListener(kind, (event) => {
      // A broken connection is an `error` too, but not a MessageEvent.
      if (!(event instanceof MessageEvent)) return;
      const message = { type: 'event', kind, data: event.data, lastEventId: event.lastEventId };
      remember(stream, message);
      broadcast(stream, message);
    });
  }
  source.addEventListener('error', (event) => {
    if (event instanceof MessageEvent) return;
    if (source.readyState === EventSource.CONNECTING) {
      broadcast(stream, { type: 'reconnecting' });
      return;
    }
    // Refused: each tab asks why and decides whether to try again.
    broadcast(stream, { type: 'closed' });
    for (const [port, ids] of stream.subscribers) {
      for (const id of ids) tabs.get(port)?.subscriptions.delete(id);
    }
    stream.subscribers.clear();
    closeStream(stream);
  });
  return stream;
}

function closeStream(stream) {
  stream.source.close();
  if (streams.get(stream.url) === stream) streams.delete(stream.url);
}

/** The keys the URL names (`key=`): part of the picture even when absent. */
function namedKeys(url) {
  try {
    return new Set(new URL(url).searchParams.getAll('key'));
  } catch {
    return new Set();
  }
}

/** The id of an event's key: its text, or its bytes when they are not UTF-8 (as app.js). */
function keyId(data) {
  if (typeof data.key === 'string') return data.key;
  if (typeof data.key_base64 === 'string') return `\u0000${data.key_base64}`;
  return null;
}

/** Keeps the event in the stream's picture. */
function remember(stream, message) {
  const { kind } = message;
  // A topic's messages are not state; its `subscribed` is, as a `listed`.
  if (kind === 'message' || kind === 'lagged') return;
  if (kind === 'subscribed') {
    stream.patterns.set(kind, message);
    return;
  }
  let data;
  try {
    data = JSON.parse(message.data);
  } catch {
    return; // the tabs say so; nothing to keep
  }
  if (data === null || typeof data !== 'object') return;
  const id = keyId(data);
  if (id === null) {
    // A pattern's own event: its listing is complete, or it takes no new keys.
    const pattern = typeof data.match === 'string' ? data.match : data.match_base64;
    if (typeof pattern !== 'string') return;
    stream.patterns.set(`${kind}\u0000${pattern}`, message);
    if (kind === 'listed') forgetUnlisted(stream);
    return;
  }
  const entry = stream.keys.get(id) ?? { state: null, error: null, epoch: stream.epoch };
  if (kind === 'error') {
    entry.error = message;
  } else {
    const exists = kind === 'set' || (kind === 'sync' && data.exists === true);
    // A pattern's key that is gone is not part of the picture.
    if (!exists && !stream.named.has(id)) {
      stream.keys.delete(id);
      return;
    }
    entry.state = { data, exists, lastEventId: message.lastEventId };
    entry.error = null;
    entry.epoch = stream.epoch;
  }
  stream.keys.set(id, entry);
}

/** After a reconnect's listing: keys not synced again are gone (they got no delete). */
function forgetUnlisted(stream) {
  for (const [id, entry] of stream.keys) {
    if (entry.epoch !== stream.epoch && !stream.named.has(id)) stream.keys.delete(id);
  }
}

/**
 * Tells a tab that joins the stream what a fresh stream would start with:
 * `open`, a `sync` of each key's latest state (its error after it), each
 * pattern's `listed`. While the stream reconnects, the picture it had,
 * then `reconnecting`; before its first `open`, nothing (all is to come).
 */
function replay(stream, port, id) {
  if (!stream.opened) return;
  const open = stream.source.readyState === EventSource.OPEN;
  if (open) send(port, { id, type: 'open' });
  for (const [key, entry] of stream.keys) {
    // Being listed again after a reconnect: a key counts once synced again.
    if (open && entry.epoch !== stream.epoch && !stream.named.has(key)) continue;
    if (entry.state) send(port, { id, ...syncOf(entry.state) });
    if (entry.error) send(port, { id, ...entry.error });
  }
  for (const message of stream.patterns.values()) send(port, { id, ...message });
  if (!open) send(port, { id, type: 'reconnecting' });
}

/** A key's latest state as the `sync` a new stream starts with (as the gateway's own). */
function syncOf(state) {
  const data = { ...state.data, op: 'sync', exists: state.exists, resync: false };
  delete data.lagged;
  return { type: 'event', kind: 'sync', data: JSON.stringify(data), lastEventId: state.lastEventId };
}

// ---- messages to the tabs ---------------------------------------------------

function broadcast(stream, message) {
  for (const [port, ids] of stream.subscribers) {
    for (const id of ids) send(port, { id, ...message });
  }
}

/**
 * Queues a message for a tab. Messages travel together once the events at
 * hand are handled (a timer of 0): a burst costs a message per tab, not one
 * per event and tab.
 */
function send(port, message) {
  let queue = outbox.get(port);
  if (!queue) {
    queue = [];
    outbox.set(port, queue);
  }
  queue.push(message);
  if (flushTimer === null) flushTimer = setTimeout(flush, 0);
}

function flush() {
  flushTimer = null;
  for (const [port, messages] of outbox) port.postMessage({ batch: messages });
  outbox.clear();
}
