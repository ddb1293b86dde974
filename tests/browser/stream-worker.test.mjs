// The dashboard's SharedWorker (src/ui/stream-worker.js) under Node's
// mocked clock: a tab that holds no Web Lock (an insecure context) is known
// alive only by its pings, and the rule that drops one silent past its
// limit takes minutes of a real browser's time. Also what a tab joining a
// topic stream late is told: its `subscribed`, not the messages before it.
// Run by `browser::the_stream_worker_drops_a_silent_tab_and_keeps_one_that_pings`.
import { test, mock } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import vm from 'node:vm';

const SOURCE = readFileSync(new URL('../../src/ui/stream-worker.js', import.meta.url), 'utf8');
// The worker's limit (two and a half minutes, as docs/observability.md says)
// and sweep period: a silent tab is dropped within both. Copies of the
// worker's, on purpose: a change to them must fail here.
const SILENT_MS = 150_000;
const SWEEP_MS = 30_000;
const URL_K = 'http://gateway.test/watch/k';

/** The worker in a context of its own, with fake EventSources; no Web Locks. */
function startWorker() {
  const sources = [];
  class FakeMessageEvent {
    constructor(data) {
      this.data = data;
      this.lastEventId = '';
    }
  }
  class FakeEventSource {
    static CONNECTING = 0;
    static OPEN = 1;
    static CLOSED = 2;
    constructor(url) {
      this.url = url;
      this.readyState = FakeEventSource.CONNECTING;
      this.listeners = new Map();
      sources.push(this);
    }
    addEventListener(type, listener) {
      this.listeners.set(type, [...(this.listeners.get(type) ?? []), listener]);
    }
    /** The gateway sends an event (`open`: the connection is up). */
    emit(type, data) {
      if (type === 'open') this.readyState = FakeEventSource.OPEN;
      const event = type === 'open' ? {} : new FakeMessageEvent(data);
      for (const listener of this.listeners.get(type) ?? []) listener(event);
      mock.timers.tick(0);
    }
    close() {
      this.readyState = FakeEventSource.CLOSED;
    }
  }
  let onConnect = null;
  const self = {
    addEventListener: (type, listener) => {
      if (type === 'connect') onConnect = listener;
    },
    navigator: {},
  };
  // Timers and the clock are read when called, so that the mocked ones run.
  const context = vm.createContext({
    self,
    EventSource: FakeEventSource,
    MessageEvent: FakeMessageEvent,
    URL,
    setTimeout: (...args) => globalThis.setTimeout(...args),
    clearTimeout: (...args) => globalThis.clearTimeout(...args),
    setInterval: (...args) => globalThis.setInterval(...args),
    Date: { now: () => Date.now() },
  });
  vm.runInContext(SOURCE, context);

  /** A tab: what it was sent, and a way to speak. */
  function connect() {
    const received = [];
    let onMessage = null;
    const port = {
      addEventListener: (type, listener) => {
        if (type === 'message') onMessage = listener;
      },
      start() {},
      postMessage: (message) => received.push(...message.batch),
    };
    onConnect({ ports: [port] });
    return {
      received,
      say(data) {
        onMessage({ data });
        mock.timers.tick(0); // the worker's outbox goes out on a timer of 0
      },
    };
  }
  return { sources, connect };
}

test('a tab silent past the limit is dropped, its stream closed, and told to start again', () => {
  mock.timers.enable({ apis: ['setTimeout', 'setInterval', 'Date'], now: 1_000_000 });
  try {
    const worker = startWorker();
    const tab = worker.connect();
    tab.say({ type: 'hello' });
    tab.say({ type: 'subscribe', id: 1, url: URL_K });
    assert.equal(worker.sources.length, 1);
    const [source] = worker.sources;

    mock.timers.tick(SILENT_MS - 1_000);
    assert.notEqual(source.readyState, 2, 'still within the limit');
    mock.timers.tick(1_000 + SWEEP_MS);
    assert.equal(source.readyState, 2, 'the silent tab was dropped and its stream closed');

    tab.say({ type: 'ping' });
    assert.equal(tab.received.at(-1)?.type, 'expired');
    // Starting again opens a fresh stream.
    tab.say({ type: 'hello' });
    tab.say({ type: 'subscribe', id: 1, url: URL_K });
    assert.equal(worker.sources.length, 2);
    assert.equal(worker.sources[1].readyState, 0);
  } finally {
    mock.timers.reset();
  }
});

test('a tab that pings keeps its stream, and a silent tab on it does not close it', () => {
  mock.timers.enable({ apis: ['setTimeout', 'setInterval', 'Date'], now: 1_000_000 });
  try {
    const worker = startWorker();
    const pinging = worker.connect();
    const silent = worker.connect();
    for (const tab of [pinging, silent]) {
      tab.say({ type: 'hello' });
      tab.say({ type: 'subscribe', id: 7, url: URL_K });
    }
    assert.equal(worker.sources.length, 1, 'one stream for both tabs');
    // Ten minutes, a ping a minute (a hidden tab's timers may run that rarely).
    for (let minute = 0; minute < 10; minute += 1) {
      mock.timers.tick(60_000);
      pinging.say({ type: 'ping' });
    }
    assert.equal(worker.sources.length, 1);
    assert.notEqual(worker.sources[0].readyState, 2, 'the pinging tab keeps the stream');
    silent.say({ type: 'ping' });
    assert.equal(silent.received.at(-1)?.type, 'expired', 'the silent tab was dropped');
  } finally {
    mock.timers.reset();
  }
});

test('a topic stream forwards its messages and replays only its subscribed to a tab that joins', () => {
  mock.timers.enable({ apis: ['setTimeout', 'setInterval', 'Date'], now: 1_000_000 });
  try {
    const url = 'http://gateway.test/subscribe?topic=orders%2F%23';
    const worker = startWorker();
    const first = worker.connect();
    first.say({ type: 'hello' });
    first.say({ type: 'subscribe', id: 1, url });
    const [source] = worker.sources;
    const subscribed = JSON.stringify({ topics: ['orders/#'] });
    const message = JSON.stringify({ topic: 'orders/eu', payload: '{"id":1}', encoding: 'utf-8', contentType: 'application/json' });
    source.emit('open');
    source.emit('subscribed', subscribed);
    source.emit('message', message);
    source.emit('lagged', JSON.stringify({ skipped: 3 }));
    const events = (tab) => tab.received.filter((m) => m.type === 'event').map((m) => [m.kind, m.data]);
    assert.deepEqual(events(first), [['subscribed', subscribed], ['message', message], ['lagged', '{"skipped":3}']]);

    const late = worker.connect();
    late.say({ type: 'hello' });
    late.say({ type: 'subscribe', id: 2, url });
    assert.equal(worker.sources.length, 1, 'one stream for both tabs');
    assert.equal(late.received[0]?.type, 'open');
    assert.deepEqual(events(late), [['subscribed', subscribed]], 'messages are not replayed');

    const next = JSON.stringify({ topic: 'orders/us', payload: 'AAE=', encoding: 'base64', contentType: null });
    source.emit('message', next);
    assert.deepEqual(events(late).at(-1), ['message', next]);
    assert.deepEqual(events(first).at(-1), ['message', next]);
  } finally {
    mock.timers.reset();
  }
});
