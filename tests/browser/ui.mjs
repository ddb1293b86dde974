#!/usr/bin/env node
// Drives the /ui/ dashboard in headless Chromium against a running gateway,
// the way a person and a curl user would together:
//
//   node tests/browser/ui.mjs http://127.0.0.1:8080
//
// 1. opens <base>/ui/ and adds the key `ui-test-key` through the page;
// 2. PUTs a value with plain fetch (not through the page) and waits until
//    the page shows that value and the version the PUT returned;
// 3. DELETEs with fetch and waits until the page shows the key as absent;
// 4. sets a value through the page's own form and checks with a GET that
//    the store holds it;
// 5. reloads the page: the watched key list survives (localStorage);
// 6. the key browser: lists keys written with fetch by a glob, pages with
//    "More keys", a click watches a key, whose numeric values then draw a
//    sparkline;
// 7. follows the key space ui-space/* live: keys created and deleted with
//    fetch (another client than the page) appear and leave by themselves,
//    a changed row flashes, numeric keys draw sparklines, a selected key
//    draws a chart against time; the pattern survives a reload; with
//    SCREENSHOT set, writes a screenshot of the page there;
// 8. follows the MQTT topic filter ui-topic/+/# (shown during 7's
//    screenshot): a message published with fetch through the Dapr publish
//    route appears in the topic table with its topic and content type;
//    the filter survives 7's reload; Stop ends it;
// 9. stops watching through the page.
//
// With SDK_PEER=1 it runs only a handshake with a writer the gateway does
// not see (the official SDK, driven by the caller): it follows ui-sdk/*,
// prints SDK_READY, waits for the key ui-sdk/from-sdk to appear with the
// value "written by the SDK" (found by the gateway's rescan), prints
// SDK_SEEN, and waits for the row to leave once the caller deleted it.
//
// With TOPIC_PEER=1 it runs only a handshake with an MQTT client the
// caller drives: it follows ui-topic/+/#, sees a Dapr publish appear (as in
// 8), prints TOPIC_READY, and waits for the message "from an MQTT client"
// on ui-topic/sensors/t1 (content type text/plain) to appear above it.
//
// With LOAD_KEYS=<n> it runs only the load test instead: n keys followed
// on one stream, then bursts of changes to all of them and their deletion;
// the page must show every final value and keep drawing frames (limits
// below), and it prints what it measured.
//
// With TABS=<n> it runs only the shared-streams test: n tabs of one
// browser (more than the six connections a browser allows an origin) watch
// the same key and follow the same pattern, and each shows what fetch
// changes. At each `ui test: TABS_…` line it waits for a line on stdin: the
// caller checks the gateway's open streams there (one per distinct stream,
// not two per tab). Two tabs watch a key of their own: one that cannot hold
// a Web Lock (it says goodbye on pagehide), one that never says goodbye
// (the worker learns from its lock); closing either ends its stream. Then
// all tabs but one close, the last stays live, and it closes too.
//
// With RECONNECT=1 it runs only the reconnect test, through a proxy the
// caller cuts: two tabs show a key through one shared stream; after
// `ui test: RECONNECT_LIVE` the caller cuts every connection, refuses new
// ones and changes the key; both tabs must say they are reconnecting
// (`RECONNECT_DOWN`), and once the caller lets connections through, show
// the change, live (`RECONNECT_BACK`).
//
// Any wait is bounded. On failure: a message on stderr, a screenshot in a
// temporary directory, and exit status 1. The page must also run without a
// script error or a Content-Security-Policy violation.
//
// CHROMIUM overrides the browser (default /usr/bin/chromium). With
// API_TOKEN set, the gateway is expected to require that token: the page
// must first say so, then work once the token is entered in its form (the
// stream carries it as access_token, fetch as a bearer header); this
// script's own requests send it as a bearer header.

import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { chromium } from 'playwright-core';

const KEY = 'ui-test-key';
const WAIT_MS = 10_000;
const REQUEST_MS = 5_000;
const OVERALL_MS = 60_000;
const LOAD_OVERALL_MS = 150_000;
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const API_TOKEN = process.env.API_TOKEN || '';
const SCREENSHOT = process.env.SCREENSHOT || '';
const LOAD_KEYS = Number(process.env.LOAD_KEYS || 0);
const SDK_PEER = process.env.SDK_PEER === '1';
const TABS = Number(process.env.TABS || 0);
const RECONNECT = process.env.RECONNECT === '1';
const TOPIC_PEER = process.env.TOPIC_PEER === '1';
const TOPIC_FILTER = 'ui-topic/+/#';
// The listing test's keys: more than one page of the browser (20).
const LISTED = Array.from({ length: 23 }, (_, n) => `ui-list/room-${String(n).padStart(2, '0')}`);
const SPARK_KEY = 'ui-list/temperature';
// Without the background-networking flags Chromium keeps dialling out, and
// a closed network refuses it; none of that traffic is needed here.
const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

class TestFailure extends Error {}

function fail(message) {
  throw new TestFailure(message);
}

function step(message) {
  console.log(`ui test: ${message}`);
}

function parseBase(arg) {
  if (!arg) fail('usage: node ui.mjs <base-url>, for example http://127.0.0.1:8080');
  let url;
  try {
    url = new URL(arg);
  } catch {
    fail(`not a URL: ${arg}`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') fail(`not an http(s) URL: ${arg}`);
  // Keep any path prefix, always with one trailing slash.
  url.pathname = url.pathname.replace(/\/*$/, '/');
  url.search = '';
  url.hash = '';
  return url;
}

/** curl-style: plain fetch from node, bounded. */
async function http(method, url, { body, accept, type } = {}) {
  const init = { method, signal: AbortSignal.timeout(REQUEST_MS), headers: {} };
  if (API_TOKEN) init.headers.Authorization = `Bearer ${API_TOKEN}`;
  if (body !== undefined) init.body = body;
  if (type) init.headers['Content-Type'] = type;
  if (accept) init.headers.Accept = accept;
  try {
    return await fetch(url, init);
  } catch (err) {
    fail(`${method} ${url} failed: ${err.cause?.message ?? err.message}`);
  }
}

async function expectStatus(response, expected, what) {
  if (!expected.includes(response.status)) {
    const body = await response.text().catch(() => '');
    fail(`${what}: expected HTTP ${expected.join(' or ')}, got ${response.status}: ${body.slice(0, 300)}`);
  }
}

/** What the page shows for `key`: its row's state and cells, or null. */
async function readRow(page, key) {
  return page.evaluate((key) => {
    const row = [...document.querySelectorAll('#rows tr')].find((tr) => tr.dataset.key === key);
    if (!row) return null;
    return {
      exists: row.dataset.exists,
      kind: row.dataset.kind,
      marker: row.querySelector('.value .marker').textContent,
      value: row.querySelector('.value .text').textContent,
      version: row.querySelector('.version').textContent,
    };
  }, key);
}

/** Polls the page (bounded) until the row of `key` satisfies `predicate`. */
async function waitForRow(page, key, description, predicate) {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    const cells = await readRow(page, key);
    if (cells && predicate(cells)) return cells;
    if (Date.now() > deadline) {
      fail(`the page did not show ${description} within ${WAIT_MS / 1000} s; it shows ${await describeRow(page, key)}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

async function describeRow(page, key) {
  return page.evaluate((key) => {
    const row = [...document.querySelectorAll('#rows tr')].find((tr) => tr.dataset.key === key);
    const state = document.getElementById('connection-text').textContent;
    const errors = [...document.querySelectorAll('#errors .error .text')].map((e) => e.textContent);
    if (!row) return `no row for ${key} (connection: ${state}; errors: ${JSON.stringify(errors)})`;
    return JSON.stringify({
      connection: state,
      exists: row.dataset.exists,
      kind: row.dataset.kind,
      row: row.innerText.replace(/\s+/g, ' ').trim(),
      errors,
    });
  }, key);
}

/** Starts Chromium and opens <base>/ui/, watching the page for script errors and CSP violations. */
async function openPage(base, problems, session) {
  session.userDataDir = await mkdtemp(path.join(tmpdir(), 'ui-test-chromium-'));
  let context;
  try {
    context = await chromium.launchPersistentContext(session.userDataDir, {
      executablePath: CHROMIUM,
      headless: true,
      args: CHROMIUM_ARGS,
      timeout: 20_000,
    });
  } catch (err) {
    fail(`Chromium (${CHROMIUM}) did not start: ${err.message}. Run scripts/install-browser-deps`);
  }
  session.context = context;
  const page = context.pages()[0] ?? (await context.newPage());
  session.page = page;
  step(`opening ${new URL('ui/', base)}`);
  await loadPage(page, base, problems);
  return page;
}

/** Loads <base>/ui/ in `page`, watching it for script errors and CSP violations. */
async function loadPage(page, base, problems) {
  page.setDefaultTimeout(WAIT_MS);
  page.on('pageerror', (err) => problems.push(`script error: ${err.message}`));
  page.on('console', (msg) => {
    const text = msg.text();
    // A blocked inline script or style says so on the console.
    if (/Content Security Policy|Refused to/i.test(text)) problems.push(`CSP: ${text}`);
    else if (msg.type() === 'error') console.error(`ui test: page console: ${text}`);
  });

  const pageUrl = new URL('ui/', base);
  const response = await page.goto(pageUrl.href, { waitUntil: 'load' });
  if (!response || response.status() !== 200) fail(`GET ${pageUrl} answered ${response?.status()}`);
  const csp = response.headers()['content-security-policy'] ?? '';
  if (!csp.includes("default-src 'self'")) fail(`the page has no strict CSP: "${csp}"`);
}

async function run(base, problems, session) {
  const keyUrl = new URL(`keys/${encodeURIComponent(KEY)}`, base);
  const token = randomBytes(6).toString('hex');

  step(`starting from an absent key (${keyUrl})`);
  await expectStatus(await http('DELETE', keyUrl), [204, 404], 'DELETE before the test');

  const page = await openPage(base, problems, session);

  step(`adding ${KEY} through the page`);
  await page.getByLabel('Key to watch').fill(KEY);
  await page.getByRole('button', { name: 'Watch', exact: true }).click();
  if (API_TOKEN) {
    step('the gateway wants a token: the page says so; entering it');
    await page
      .locator('#connection-text')
      .filter({ hasText: 'needs its API token' })
      .waitFor({ timeout: WAIT_MS })
      .catch(() => fail(`the page did not ask for the token: ${JSON.stringify(problems)}`));
    await page.evaluate(() => {
      document.getElementById('token-box').open = true;
    });
    await page.locator('#token').fill(API_TOKEN);
    await page.getByRole('button', { name: 'Use', exact: true }).click();
  }
  await waitForRow(page, KEY, 'the key as absent after its first sync', (c) => c.kind === 'sync' && c.exists === 'false');
  const connection = await page.locator('#connection').getAttribute('data-state');
  if (connection !== 'live') fail(`the connection state is ${connection}, not live`);
  const stored = await page.evaluate(() => localStorage.getItem('statestore-gateway.ui.keys'));
  if (stored !== JSON.stringify([KEY])) fail(`localStorage holds ${stored}`);

  const curlValue = `hello from curl ${token}`;
  step(`PUT "${curlValue}" with fetch`);
  const put = await http('PUT', keyUrl, { body: curlValue });
  await expectStatus(put, [200], 'PUT from curl');
  const { version } = await put.json();
  if (typeof version !== 'string' || version === '') fail(`PUT answered no version`);
  await waitForRow(
    page,
    KEY,
    `"${curlValue}" at version ${version}`,
    (c) => c.kind === 'set' && c.value === curlValue && c.version === version,
  );

  step('DELETE with fetch');
  await expectStatus(await http('DELETE', keyUrl), [204], 'DELETE from curl');
  await waitForRow(
    page,
    KEY,
    'the key as absent after the delete',
    (c) => c.kind === 'delete' && c.exists === 'false' && c.marker === 'absent' && c.value === '',
  );

  // Not only ASCII: the page must send UTF-8.
  const pageValue = `set from the page ${token} ✓ é`;
  step(`setting "${pageValue}" through the page's form`);
  await page.getByLabel(`New value for ${KEY}`).fill(pageValue);
  await page.getByRole('button', { name: `Set ${KEY}`, exact: true }).click();
  await page.locator('#notice').filter({ hasText: `Set ${KEY} (version` }).waitFor({ timeout: WAIT_MS });
  const get = await http('GET', keyUrl, { accept: 'application/json' });
  await expectStatus(get, [200], 'GET after the page set the value');
  const held = await get.json();
  if (held.value !== pageValue) fail(`the store holds ${JSON.stringify(held)}, not "${pageValue}"`);
  await waitForRow(page, KEY, `"${pageValue}"`, (c) => c.value === pageValue && c.exists === 'true');

  step('reloading: the watched key list survives');
  await page.reload({ waitUntil: 'load' });
  await waitForRow(page, KEY, `"${pageValue}" after a reload`, (c) => c.kind === 'sync' && c.value === pageValue);

  const lockName = `${KEY}-lock`;
  const lockUrl = (query) => new URL(`locks/${encodeURIComponent(lockName)}?${query}`, base);
  step(`watching ${lockName} as a lock: the page shows its holder and fencing token`);
  await page.getByLabel('Key to watch').fill(lockName);
  await page.getByLabel('as a lock (value = holder)').check();
  await page.getByRole('button', { name: 'Watch', exact: true }).click();
  await waitForRow(page, lockName, 'the lock as free', (c) => c.kind === 'sync' && c.marker === 'lock free');
  const acquired = await http('PUT', lockUrl(`holder=page-test-${token}&ttl=30s`));
  await expectStatus(acquired, [200], 'PUT /locks');
  const { fencing_token: fencingToken } = await acquired.json();
  await waitForRow(
    page,
    lockName,
    `the lock held by page-test-${token}`,
    (c) => c.marker === 'held by' && c.value === `page-test-${token}` && c.version === `fencing token ${fencingToken}`,
  );
  await expectStatus(await http('DELETE', lockUrl(`holder=page-test-${token}`)), [204], 'DELETE /locks');
  await waitForRow(page, lockName, 'the lock as free after its release', (c) => c.marker === 'lock free');
  await page.getByRole('button', { name: `Stop watching ${lockName}`, exact: true }).click();
  await page.locator('#rows tr').nth(1).waitFor({ state: 'detached', timeout: WAIT_MS });
  await browseAndSparkline(base, page);
  await followTopic(base, page, token);
  await followKeySpace(base, page);
  step('the followed topic survived the reload; stopping it');
  await waitForTopicRows(page, 'the topic followed again after the reload', (t) => t.connection === 'live' && t.text.includes(TOPIC_FILTER));
  await page.getByRole('button', { name: 'Stop', exact: true }).click();
  await page.locator('#topic-box').waitFor({ state: 'hidden', timeout: WAIT_MS });
  const topicState = await page.locator('#topic-connection').getAttribute('data-state');
  if (topicState !== 'idle') fail(`after Stop the topic's connection state is ${topicState}, not idle`);
  const keptTopic = await page.evaluate(() => localStorage.getItem('statestore-gateway.ui.topic'));
  if (keptTopic !== null) fail(`after Stop localStorage still keeps the topic ${keptTopic}`);

  step('deleting through the page, then stopping the watch');
  await page.getByRole('button', { name: `Delete ${KEY} from the store`, exact: true }).click();
  await waitForRow(page, KEY, 'the key as absent after the page deleted it', (c) => c.exists === 'false');
  await page.getByRole('button', { name: `Stop watching ${KEY}`, exact: true }).click();
  await page.locator('#rows tr').first().waitFor({ state: 'detached', timeout: WAIT_MS });
  const state = await page.locator('#connection').getAttribute('data-state');
  if (state !== 'idle') fail(`with no key watched the connection state is ${state}, not idle`);

  if (problems.length > 0) fail(problems.join('\n'));
}

/** The key browser: list by glob, page, click to watch, sparkline. */
async function browseAndSparkline(base, page) {
  const keyUrl = (key) => new URL(`keys/${encodeURIComponent(key)}`, base);
  step(`writing ${LISTED.length + 1} keys under ui-list/ with fetch`);
  for (const key of [...LISTED, SPARK_KEY]) {
    await expectStatus(await http('PUT', keyUrl(key), { body: key === SPARK_KEY ? '19.5' : 'on' }), [200], `PUT ${key}`);
  }
  await expectStatus(await http('PUT', keyUrl('ui-other'), { body: 'x' }), [200], 'PUT ui-other');

  step('listing ui-list/* in the key browser, then its second page');
  await page.getByLabel('Keys matching').fill('ui-list/*');
  await page.getByRole('button', { name: 'List', exact: true }).click();
  const listed = () => page.evaluate(() => [...document.querySelectorAll('#browse-list button')].map((b) => b.dataset.key));
  await page.locator('#browse-status').filter({ hasText: 'more to list' }).waitFor({ timeout: WAIT_MS })
    .catch(async () => fail(`no first page with more to list: ${JSON.stringify(await listed())}`));
  const first = await listed();
  if (first.length !== 20) fail(`the first page lists ${first.length} keys, not 20: ${JSON.stringify(first)}`);
  await page.getByRole('button', { name: 'More keys', exact: true }).click();
  await page.locator('#browse-status').filter({ hasText: `${LISTED.length + 1} keys matching ui-list/*` })
    .waitFor({ timeout: WAIT_MS })
    .catch(async () => fail(`the second page did not complete the listing: ${JSON.stringify(await listed())}`));
  const all = await listed();
  const expected = [...LISTED, SPARK_KEY].sort();
  if (JSON.stringify([...all].sort()) !== JSON.stringify(expected)) {
    fail(`the browser lists ${JSON.stringify(all)}, not ${JSON.stringify(expected)}`);
  }
  if (!(await page.locator('#browse-more').isHidden())) fail('"More keys" is still offered after the last page');

  step(`clicking ${SPARK_KEY} watches it; numeric values draw a sparkline`);
  await page.getByRole('button', { name: `Watch ${SPARK_KEY}`, exact: true }).click();
  await waitForRow(page, SPARK_KEY, 'its value 19.5 after its first sync', (c) => c.kind === 'sync' && c.value === '19.5');
  const values = ['21', '20.25', '23', '22.5', '24.75'];
  for (const value of values) {
    await expectStatus(await http('PUT', keyUrl(SPARK_KEY), { body: value }), [200], `PUT ${value}`);
    await waitForRow(page, SPARK_KEY, `the value ${value}`, (c) => c.value === value);
  }
  const spark = await page.evaluate((key) => {
    const row = [...document.querySelectorAll('#rows tr')].find((tr) => tr.dataset.key === key);
    const svg = row?.querySelector('svg.spark');
    if (!svg) return null;
    const box = svg.getBoundingClientRect();
    const hidden = svg.hasAttribute('hidden') || box.width === 0 || box.height === 0;
    return { hidden, points: svg.querySelector('polyline').getAttribute('points') };
  }, SPARK_KEY);
  const points = (spark?.points ?? '').trim().split(/\s+/).filter(Boolean);
  if (!spark || spark.hidden || points.length !== values.length + 1) {
    fail(`the sparkline shows ${JSON.stringify(spark)}, not ${values.length + 1} points`);
  }
  // The highest value (24.75, the last) is at the top, the lowest (19.5, the first) at the bottom.
  const ys = points.map((point) => Number(point.split(',')[1]));
  if (!(ys[0] === Math.max(...ys) && ys[ys.length - 1] === Math.min(...ys))) fail(`sparkline points ${spark.points} do not follow the values`);

  step(`stopping the watch of ${SPARK_KEY} and deleting the listed keys`);
  await page.getByRole('button', { name: `Stop watching ${SPARK_KEY}`, exact: true }).click();
  await page.locator(`#rows tr[data-key="${SPARK_KEY}"]`).waitFor({ state: 'detached', timeout: WAIT_MS });
  for (const key of [...LISTED, SPARK_KEY, 'ui-other']) {
    await expectStatus(await http('DELETE', keyUrl(key)), [204], `DELETE ${key}`);
  }
}

/** What the followed table shows: its rows in order, the status and the count line. */
async function readFollowed(page) {
  return page.evaluate(() => ({
    connection: document.getElementById('follow-text').textContent,
    count: document.getElementById('follow-count').textContent,
    hidden: document.getElementById('follow').hidden,
    rows: [...document.querySelectorAll('#follow-rows tr')].map((row) => ({
      key: row.dataset.key,
      exists: row.dataset.exists,
      flash: row.dataset.flash ?? '',
      marker: row.querySelector('.value .marker').textContent,
      value: row.querySelector('.value .text').textContent,
      version: row.querySelector('.version').textContent,
      time: row.querySelector('.changed .time').textContent,
      spark: row.querySelector('.spark').hasAttribute('hidden')
        ? 0
        : row.querySelector('.spark polyline').getAttribute('points').trim().split(/\s+/).length,
    })),
  }));
}

/** Polls the followed table (bounded) until `predicate` holds for it. */
async function waitForFollowed(page, description, predicate, waitMs = WAIT_MS) {
  const deadline = Date.now() + waitMs;
  for (;;) {
    const table = await readFollowed(page);
    if (predicate(table)) return table;
    if (Date.now() > deadline) {
      const rows = table.rows.slice(0, 12).map((r) => `${r.key}=${r.marker}${r.value}@${r.version}`);
      const errors = await page.evaluate(() => [...document.querySelectorAll('#errors .error .text')].map((e) => e.textContent));
      fail(`the followed table did not show ${description} within ${waitMs / 1000} s; it shows ` +
        `${JSON.stringify({ connection: table.connection, count: table.count, n: table.rows.length, rows, errors })}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

const SPACE = 'ui-space/*';
const SPACE_KEYS = {
  'ui-space/line-1/temperature': '21.5',
  'ui-space/line-1/pressure': '1013.2',
  'ui-space/line-2/temperature': '19.75',
  'ui-space/line-2/state': 'running',
};
const TIME_OF_DAY = /^\d\d:\d\d:\d\d$/;

/**
 * Follows ui-space/* live while this script (not the page) creates,
 * changes and deletes keys with plain HTTP requests.
 */
async function followKeySpace(base, page) {
  const keyUrl = (key) => new URL(`keys/${encodeURIComponent(key)}`, base);
  const put = async (key, value) => {
    const response = await http('PUT', keyUrl(key), { body: value });
    await expectStatus(response, [200], `PUT ${key}`);
    return (await response.json()).version;
  };
  const created = 'ui-space/line-3/temperature';
  await expectStatus(await http('DELETE', keyUrl(created)), [204, 404], `DELETE ${created} before the test`);
  step(`writing ${Object.keys(SPACE_KEYS).length} keys under ui-space/ and one beside it with fetch`);
  for (const [key, value] of Object.entries(SPACE_KEYS)) await put(key, value);
  await put('ui-spaceship', 'outside the pattern');

  step(`following ${SPACE}: one row per matching key, sorted, nothing else`);
  await page.getByLabel('Keys matching').fill(SPACE);
  await page.getByRole('button', { name: 'List', exact: true }).click();
  await page.getByRole('button', { name: 'Follow live', exact: true }).click();
  const sorted = Object.keys(SPACE_KEYS).sort();
  let table = await waitForFollowed(page, `the ${sorted.length} keys, live`, (t) =>
    t.connection === 'Live' && t.count === `${sorted.length} keys matching` &&
    JSON.stringify(t.rows.map((r) => r.key)) === JSON.stringify(sorted));
  for (const row of table.rows) {
    if (row.value !== SPACE_KEYS[row.key] || row.exists !== 'true' || !TIME_OF_DAY.test(row.time) || row.version === '—') {
      fail(`the row of ${row.key} shows ${JSON.stringify(row)}`);
    }
  }
  // The initial listing is not a change: no row flashes for it.
  if (table.rows.some((r) => r.flash !== '')) fail(`rows flashed on the initial listing: ${JSON.stringify(table.rows)}`);

  step(`another client creates ${created}: it appears by itself, flashing`);
  const createdVersion = await put(created, '25');
  table = await waitForFollowed(page, `${created} at version ${createdVersion}`, (t) =>
    t.rows.some((r) => r.key === created && r.value === '25' && r.version === createdVersion));
  const keys = table.rows.map((r) => r.key);
  if (JSON.stringify(keys) !== JSON.stringify([...sorted, created].sort())) fail(`the rows are ${JSON.stringify(keys)}, not sorted`);
  if (table.rows.find((r) => r.key === created).flash === '') fail(`the new row of ${created} did not flash`);
  if (table.count !== '5 keys matching') fail(`the count says "${table.count}"`);

  const chartKey = 'ui-space/line-1/temperature';
  const values = ['22', '21.25', '23.5', '22.75', '24'];
  step(`${chartKey} changes ${values.length} times: the row flashes each time and draws a sparkline`);
  for (const value of values) {
    const before = (await readFollowed(page)).rows.find((r) => r.key === chartKey).flash;
    const version = await put(chartKey, value);
    table = await waitForFollowed(page, `${chartKey} = ${value}`, (t) =>
      t.rows.some((r) => r.key === chartKey && r.value === value && r.version === version && r.flash !== before));
  }
  const sparkPoints = table.rows.find((r) => r.key === chartKey).spark;
  if (sparkPoints !== values.length + 1) fail(`the sparkline of ${chartKey} has ${sparkPoints} points, not ${values.length + 1}`);
  // A key that is not a number has no sparkline.
  if (table.rows.find((r) => r.key === 'ui-space/line-2/state').spark !== 0) fail('a text value drew a sparkline');

  step(`selecting ${chartKey}: a chart of its values against time`);
  await page.getByRole('button', { name: chartKey, exact: true }).click();
  await page.locator('#chart-note').filter({ hasText: `${values.length + 1} values from 21.25 to 24, now 24` })
    .waitFor({ timeout: WAIT_MS })
    .catch(async () => fail(`the chart says "${await page.locator('#chart').innerText().catch(() => '?')}"`));
  const chart = await page.evaluate(() => {
    const svg = document.getElementById('chart-svg');
    const box = svg.getBoundingClientRect();
    return {
      width: box.width,
      dots: [...svg.querySelectorAll('.points circle')].map((c) => Number(c.getAttribute('cy'))),
      path: svg.querySelector('.line').getAttribute('d'),
      times: [...svg.querySelectorAll('.x-axis text')].map((t) => t.textContent),
      pressed: document.querySelector('#follow-rows tr.selected .select')?.getAttribute('aria-pressed'),
    };
  });
  if (chart.width < 300 || chart.dots.length !== values.length + 1 || !chart.path.startsWith('M')) {
    fail(`the chart shows ${JSON.stringify(chart)}`);
  }
  // 24 (the last) is the highest value, drawn at the top; 21.25 the lowest.
  if (Math.min(...chart.dots) !== chart.dots.at(-1) || Math.max(...chart.dots) !== chart.dots[2]) {
    fail(`the chart's points ${JSON.stringify(chart.dots)} do not follow the values`);
  }
  if (chart.times.length < 2 || !chart.times.every((t) => TIME_OF_DAY.test(t))) fail(`the time axis reads ${JSON.stringify(chart.times)}`);
  if (chart.pressed !== 'true') fail('the selected key is not marked as pressed');

  const deleted = 'ui-space/line-2/state';
  step(`another client deletes ${deleted}: its row says so, then leaves`);
  await expectStatus(await http('DELETE', keyUrl(deleted)), [204], `DELETE ${deleted}`);
  await waitForFollowed(page, `${deleted} marked deleted`, (t) =>
    t.rows.some((r) => r.key === deleted && r.exists === 'false' && r.marker === 'deleted') || !t.rows.some((r) => r.key === deleted));
  table = await waitForFollowed(page, `${deleted} gone`, (t) =>
    !t.rows.some((r) => r.key === deleted) && t.count === '4 keys matching');

  if (SCREENSHOT) {
    // A few more readings, so that the picture has sparklines to show.
    const readings = [
      ['ui-space/line-1/pressure', '1012.8'], ['ui-space/line-2/temperature', '20.5'],
      ['ui-space/line-1/pressure', '1013.6'], ['ui-space/line-2/temperature', '20.25'],
      ['ui-space/line-1/pressure', '1013.1'], ['ui-space/line-2/temperature', '21'],
    ];
    for (const [key, value] of readings) {
      const version = await put(key, value);
      await waitForFollowed(page, `${key} = ${value}`, (t) => t.rows.some((r) => r.key === key && r.version === version));
    }
    await mkdir(path.dirname(SCREENSHOT), { recursive: true });
    await page.setViewportSize({ width: 1100, height: 800 });
    await page.screenshot({ path: SCREENSHOT, fullPage: true, timeout: 10_000 });
    step(`screenshot written to ${SCREENSHOT}`);
  }

  step('reloading: the followed pattern survives, its keys listed again');
  await page.reload({ waitUntil: 'load' });
  const remaining = [...sorted.filter((k) => k !== deleted), created].sort();
  await waitForFollowed(page, `the ${remaining.length} remaining keys, live`, (t) =>
    t.connection === 'Live' && JSON.stringify(t.rows.map((r) => r.key)) === JSON.stringify(remaining));

  step('stopping following; the keys are deleted');
  await page.getByRole('button', { name: 'Stop following', exact: true }).click();
  await waitForFollowed(page, 'no followed section', (t) => t.hidden && t.rows.length === 0);
  const kept = await page.evaluate(() => localStorage.getItem('statestore-gateway.ui.follow'));
  if (kept !== null) fail(`the stopped pattern is still kept: ${kept}`);
  for (const key of [...remaining, 'ui-spaceship']) {
    await expectStatus(await http('DELETE', keyUrl(key)), [204], `DELETE ${key}`);
  }
}

/** Runs `work(item)` for every item, `concurrency` at a time. */
async function eachConcurrently(items, concurrency, work) {
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const item = items[next];
      next += 1;
      await work(item);
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, items.length) }, worker));
}

// What "keeps up" means at LOAD_KEYS keys: generous bounds for a shared,
// busy machine, far below what redrawing the table per event would take
// (thousands of events, each a pass over every row).
const LOAD_CATCH_UP_MS = 5_000; // from the last write's answer to the page showing it
const LOAD_LONGEST_TASK_MS = 1_000; // the longest main-thread task during the burst
const LOAD_ROUNDS = 3; // changes per key in the burst
const LOAD_CONCURRENCY = 32;

/**
 * A second follower of `pattern`, in this script: counts the events the
 * gateway sends, and the last kind per key, so that a failure says whether
 * the gateway or the page lost an event.
 */
async function rawFollower(base, pattern) {
  const abort = new AbortController();
  const seen = { counts: {}, last: new Map(), stop: () => abort.abort() };
  const response = await fetch(new URL(`watch?match=${encodeURIComponent(pattern)}`, base), {
    signal: abort.signal,
    headers: API_TOKEN ? { Authorization: `Bearer ${API_TOKEN}` } : {},
  });
  if (!response.ok) fail(`a second follower of ${pattern} got HTTP ${response.status}`);
  (async () => {
    let buffer = '';
    try {
      for await (const chunk of response.body) {
        buffer += Buffer.from(chunk).toString();
        for (let end; (end = buffer.indexOf('\n\n')) >= 0;) {
          const event = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const kind = /^event: (.*)$/m.exec(event)?.[1];
          const data = /^data: (.*)$/m.exec(event)?.[1];
          if (!kind) continue;
          seen.counts[kind] = (seen.counts[kind] ?? 0) + 1;
          const parsed = data ? JSON.parse(data) : {};
          if (typeof parsed.key === 'string') seen.last.set(parsed.key, parsed.exists === false ? 'absent' : kind);
        }
      }
    } catch {
      // aborted at the end
    }
  })();
  return seen;
}

/** LOAD_KEYS keys followed on one stream, a burst of changes, then their deletion. */
async function runLoad(base, problems, session) {
  const keys = Array.from({ length: LOAD_KEYS }, (_, n) => `ui-load/k-${String(n).padStart(5, '0')}`);
  const keyUrl = (key) => new URL(`keys/${encodeURIComponent(key)}`, base);
  const put = async (key, value) => expectStatus(await http('PUT', keyUrl(key), { body: value }), [200], `PUT ${key}`);

  step(`writing ${keys.length} keys under ui-load/`);
  let started = Date.now();
  await eachConcurrently(keys, LOAD_CONCURRENCY, (key) => put(key, '0'));
  step(`  ${keys.length} PUTs in ${Date.now() - started} ms`);

  const page = await openPage(base, problems, session);
  step(`following ui-load/*: ${keys.length} rows`);
  started = Date.now();
  await page.getByLabel('Keys matching').fill('ui-load/*');
  await page.getByRole('button', { name: 'Follow live', exact: true }).click();
  await waitForFollowed(page, `${keys.length} keys, live`, (t) =>
    t.connection === 'Live' && t.count === `${keys.length} keys matching` && t.rows.length === keys.length, 30_000);
  step(`  listed and drawn in ${Date.now() - started} ms`);

  const raw = await rawFollower(base, 'ui-load/*');

  // Measured inside the page: every frame's gap, every long task, and how
  // many rows each batch of DOM changes touched (a redraw of the whole
  // table per event would touch every row thousands of times).
  await page.evaluate(() => {
    const monitor = {
      frames: 0, longestFrameMs: 0, longTasks: 0, longestTaskMs: 0, longTaskMs: 0,
      batches: 0, rowsTouched: 0, mostRowsInABatch: 0, running: true,
    };
    window.loadMonitor = monitor;
    let last = performance.now();
    const frame = (now) => {
      monitor.frames += 1;
      monitor.longestFrameMs = Math.max(monitor.longestFrameMs, now - last);
      last = now;
      if (monitor.running) requestAnimationFrame(frame);
    };
    requestAnimationFrame(frame);
    new PerformanceObserver((list) => {
      for (const task of list.getEntries()) {
        monitor.longTasks += 1;
        monitor.longTaskMs += task.duration;
        monitor.longestTaskMs = Math.max(monitor.longestTaskMs, task.duration);
      }
    }).observe({ type: 'longtask' });
    new MutationObserver((records) => {
      if (!monitor.running) return;
      const rows = new Set();
      for (const record of records) {
        const node = record.target.nodeType === Node.ELEMENT_NODE ? record.target : record.target.parentElement;
        const row = node?.closest('#follow-rows > tr');
        if (row) rows.add(row);
      }
      monitor.batches += 1;
      monitor.rowsTouched += rows.size;
      monitor.mostRowsInABatch = Math.max(monitor.mostRowsInABatch, rows.size);
    }).observe(document.getElementById('follow-rows'), { subtree: true, childList: true, attributes: true, characterData: true });
  });

  const final = `${LOAD_ROUNDS}.5`;
  step(`a burst: every key changes ${LOAD_ROUNDS} times (${keys.length * LOAD_ROUNDS} writes)`);
  started = Date.now();
  const writes = [];
  for (let round = 1; round <= LOAD_ROUNDS; round += 1) for (const key of keys) writes.push([key, `${round}.5`]);
  await eachConcurrently(writes, LOAD_CONCURRENCY, ([key, value]) => put(key, value));
  const written = Date.now();
  // A light probe (the full table read would itself be a long task in the page).
  const showing = () => page.evaluate((final) => {
    let n = 0;
    for (const text of document.querySelectorAll('#follow-rows td.value .text')) if (text.textContent === final) n += 1;
    return n;
  }, final);
  for (const deadline = written + LOAD_CATCH_UP_MS + 5_000; ;) {
    const n = await showing();
    if (n === keys.length) break;
    if (Date.now() > deadline) fail(`${Date.now() - written} ms after the last write the page shows ${final} for ${n} of ${keys.length} keys`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  const caughtUp = Date.now();
  const monitor = await page.evaluate(() => {
    window.loadMonitor.running = false;
    return window.loadMonitor;
  });
  const sparks = (await readFollowed(page)).rows.filter((r) => r.spark === LOAD_ROUNDS + 1).length;
  const seconds = (written - started) / 1000;
  step(`  ${writes.length} writes in ${written - started} ms (${Math.round(writes.length / seconds)}/s); ` +
    `the page showed the last ${caughtUp - written} ms after the last write's answer; ` +
    `${monitor.frames} frames, longest frame gap ${Math.round(monitor.longestFrameMs)} ms, ` +
    `${monitor.longTasks} long tasks (${Math.round(monitor.longTaskMs)} ms in all, longest ${Math.round(monitor.longestTaskMs)} ms); ` +
    `${monitor.batches} batches of DOM changes touched ${monitor.rowsTouched} rows (at most ${monitor.mostRowsInABatch} at once); ` +
    `${sparks} sparklines of ${LOAD_ROUNDS + 1} points`);
  if (caughtUp - written > LOAD_CATCH_UP_MS) fail(`the page needed ${caughtUp - written} ms to catch up, more than ${LOAD_CATCH_UP_MS}`);
  if (monitor.longestTaskMs > LOAD_LONGEST_TASK_MS) fail(`a task took ${Math.round(monitor.longestTaskMs)} ms, more than ${LOAD_LONGEST_TASK_MS}`);
  // Each change touches its own row once at most: never the whole table per event.
  if (monitor.rowsTouched > writes.length) fail(`${monitor.rowsTouched} row updates for ${writes.length} changes`);
  if (sparks !== keys.length) fail(`${sparks} of ${keys.length} rows have a sparkline of ${LOAD_ROUNDS + 1} points`);

  step(`deleting the ${keys.length} keys: every row leaves`);
  started = Date.now();
  await eachConcurrently(keys, LOAD_CONCURRENCY, async (key) => expectStatus(await http('DELETE', keyUrl(key)), [204], `DELETE ${key}`));
  try {
    await waitForFollowed(page, 'no row left', (t) => t.rows.length === 0 && t.count === '0 keys matching', 30_000);
  } finally {
    const alive = keys.filter((key) => !['delete', 'absent'].includes(raw.last.get(key)));
    step(`  the second follower got ${JSON.stringify(raw.counts)}; ${alive.length} keys without a final delete` +
      (alive.length > 0 ? `, e.g. ${alive.slice(0, 3).map((key) => `${key}: ${raw.last.get(key)}`).join(', ')}` : ''));
    raw.stop();
  }
  step(`  all gone ${Date.now() - started} ms after the first delete`);
  if (problems.length > 0) fail(problems.join('\n'));
}

/** Lines the caller of SDK_PEER=1 waits for before its next write. */
const SDK_READY = 'ui test: SDK_READY';
const SDK_SEEN = 'ui test: SDK_SEEN';
// The SDK's key is found by a rescan (every --watch-rescan-interval).
const SDK_WAIT_MS = 20_000;

/** Follows ui-sdk/* while the caller creates and deletes a key through the official SDK. */
async function runSdkPeer(base, problems, session) {
  const page = await openPage(base, problems, session);
  const key = 'ui-sdk/from-sdk';
  await page.getByLabel('Keys matching').fill('ui-sdk/*');
  await page.getByRole('button', { name: 'Follow live', exact: true }).click();
  await waitForFollowed(page, 'an empty key space, live', (t) => t.connection === 'Live' && t.count === '0 keys matching');
  console.log(SDK_READY);
  const table = await waitForFollowed(page, `${key} written by the SDK`, (t) =>
    t.rows.some((r) => r.key === key && r.value === 'written by the SDK' && r.exists === 'true'), SDK_WAIT_MS);
  if (table.rows.length !== 1) fail(`the followed table shows ${JSON.stringify(table.rows)}`);
  console.log(SDK_SEEN);
  await waitForFollowed(page, `${key} gone after the SDK deleted it`, (t) => t.rows.length === 0 && t.count === '0 keys matching', SDK_WAIT_MS);
  if (problems.length > 0) fail(problems.join('\n'));
}

/** The topic table's rows, newest first, and its connection state. */
async function readTopicRows(page) {
  return page.evaluate(() => ({
    connection: document.getElementById('topic-connection').dataset.state,
    text: document.getElementById('topic-text').textContent,
    rows: [...document.querySelectorAll('#topic-rows tr')].map((row) => ({
      time: row.querySelector('.time').getAttribute('datetime'),
      topic: row.querySelector('.topic').textContent,
      type: row.querySelector('.content-type').textContent,
      marker: row.querySelector('.marker').textContent,
      payload: row.querySelector('.text').textContent,
    })),
  }));
}

/** Polls the topic table (bounded) until `predicate` holds. */
async function waitForTopicRows(page, description, predicate) {
  const deadline = Date.now() + WAIT_MS;
  let seen;
  for (;;) {
    seen = await readTopicRows(page);
    if (predicate(seen)) return seen;
    if (Date.now() > deadline) fail(`the topic table never showed ${description}: ${JSON.stringify(seen)}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/**
 * Follows TOPIC_FILTER through the page's form, then publishes a JSON
 * message through the Dapr publish route until it shows (the gateway's
 * broker subscription is made as the stream opens, so a message published
 * at that moment may miss it): its row names its topic and Dapr's
 * CloudEvent content type, and holds the message.
 */
async function followTopic(base, page, token) {
  step(`following the topic filter ${TOPIC_FILTER} through the page`);
  await page.getByLabel('MQTT topic filter').fill(TOPIC_FILTER);
  await page.getByRole('button', { name: 'Follow', exact: true }).click();
  await waitForTopicRows(page, 'a live stream with no message', (t) => t.connection === 'live' && t.rows.length === 0);
  const topic = 'ui-topic/orders/eu';
  const publishUrl = new URL(`v1.0/publish/pubsub/${topic}`, base);
  const body = JSON.stringify({ order: token, items: 3 });
  step(`publishing ${body} on ${topic} through the Dapr publish route`);
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    await expectStatus(await http('POST', publishUrl, { body, type: 'application/json' }), [204], 'POST /v1.0/publish');
    const seen = await readTopicRows(page);
    if (seen.rows.length > 0) break;
    if (Date.now() > deadline) fail(`no published message showed within ${WAIT_MS / 1000} s`);
    await new Promise((resolve) => setTimeout(resolve, 300));
  }
  const { rows } = await waitForTopicRows(page, `the message on ${topic}`, (t) => t.rows.length > 0);
  const row = rows[rows.length - 1];
  if (row.topic !== topic || row.type !== 'application/cloudevents+json' || !row.payload.includes(`"order":"${token}"`)) {
    fail(`the published message shows as ${JSON.stringify(row)}`);
  }
  if (!row.time) fail('the message row has no time received');
  return topic;
}

const TOPIC_READY = 'ui test: TOPIC_READY';

/** Follows TOPIC_FILTER while the caller publishes with a plain MQTT client. */
async function runTopicPeer(base, problems, session) {
  const page = await openPage(base, problems, session);
  const daprTopic = await followTopic(base, page, randomBytes(6).toString('hex'));
  console.log(TOPIC_READY);
  const topic = 'ui-topic/sensors/t1';
  const { rows } = await waitForTopicRows(page, `the MQTT client's message on ${topic}`, (t) =>
    t.rows.some((r) => r.topic === topic));
  const newest = rows[0];
  if (newest.topic !== topic || newest.payload !== 'from an MQTT client' || newest.type !== 'text/plain' || newest.marker !== '') {
    fail(`the MQTT client's message shows as ${JSON.stringify(newest)}, newest first expected`);
  }
  if (rows[rows.length - 1].topic !== daprTopic) fail(`the Dapr message is no longer below it: ${JSON.stringify(rows)}`);
  if (problems.length > 0) fail(problems.join('\n'));
}

/** Prints `ui test: <word>` and waits for the caller's line on stdin (it checks the gateway meanwhile). */
const caller = TABS > 0 || RECONNECT ? createInterface({ input: process.stdin }) : null;
const callerLines = caller?.[Symbol.asyncIterator]();
async function handshake(word) {
  console.log(`ui test: ${word}`);
  const { done } = await callerLines.next();
  if (done) fail(`the caller closed stdin after ${word}`);
}

/** Polls every tab (bounded) until `predicate(tab)` holds for each; says which do not. */
async function waitForEveryTab(pages, description, predicate) {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    const states = await Promise.all(pages.map((page) => page.evaluate(() => {
      const row = document.querySelector('#rows tr');
      return {
        connection: document.getElementById('connection').dataset.state,
        follow: document.getElementById('follow-text').textContent,
        watched: row ? { key: row.dataset.key, kind: row.dataset.kind, value: row.querySelector('.value .text').textContent } : null,
        followed: [...document.querySelectorAll('#follow-rows tr')].map((tr) => [tr.dataset.key, tr.querySelector('.value .text').textContent]),
        errors: [...document.querySelectorAll('#errors .error .text')].map((e) => e.textContent),
      };
    })));
    const failing = states.map((state, n) => [n + 1, state]).filter(([, state]) => !predicate(state));
    if (failing.length === 0) return;
    if (Date.now() > deadline) {
      fail(`${failing.length} of ${pages.length} tabs did not show ${description} within ${WAIT_MS / 1000} s, e.g. tab ` +
        `${failing[0][0]}: ${JSON.stringify(failing[0][1])}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** TABS tabs of one browser share their two streams; see the top of this file. */
async function runTabs(base, problems, session) {
  const shared = 'ui-tabs/shared';
  const created = 'ui-tabs/created';
  const keyUrl = (key) => new URL(`keys/${encodeURIComponent(key)}`, base);
  const put = async (key, value) => {
    const response = await http('PUT', keyUrl(key), { body: value });
    await expectStatus(response, [200], `PUT ${key}`);
    return (await response.json()).version;
  };
  for (const key of [shared, created]) await expectStatus(await http('DELETE', keyUrl(key)), [204, 404], `DELETE ${key}`);
  await put(shared, 'start');

  const first = await openPage(base, problems, session);
  step(`the first tab watches ${shared} and follows ui-tabs/* (kept for the next tabs)`);
  await first.getByLabel('Key to watch').fill(shared);
  await first.getByRole('button', { name: 'Watch', exact: true }).click();
  await first.getByLabel('Keys matching').fill('ui-tabs/*');
  await first.getByRole('button', { name: 'Follow live', exact: true }).click();
  const pages = [first];
  const showing = (value, followed) => (t) => t.connection === 'live' && t.follow === 'Live' &&
    t.watched?.key === shared && t.watched.value === value &&
    JSON.stringify(t.followed) === JSON.stringify(followed);
  await waitForEveryTab(pages, `${shared} = start, live`, showing('start', [[shared, 'start']]));

  // A tab that starts while another drops the kept pattern, even for a
  // moment, would not follow it: the first tab counts such moments.
  await first.evaluate(() => {
    window.followForgotten = 0;
    window.addEventListener('storage', (event) => {
      if (event.key === 'statestore-gateway.ui.follow' && event.newValue === null) window.followForgotten += 1;
    });
  });
  step(`opening ${TABS - 1} more tabs in the same browser`);
  const started = Date.now();
  for (let n = 1; n < TABS; n += 1) {
    const page = await session.context.newPage();
    pages.push(page);
    await loadPage(page, base, problems);
  }
  await waitForEveryTab(pages, `${shared} = start, live`, showing('start', [[shared, 'start']]));
  step(`  ${TABS} tabs live ${Date.now() - started} ms after the second opened`);
  const forgotten = await first.evaluate(() => window.followForgotten);
  if (forgotten !== 0) fail(`starting tabs dropped the kept pattern ${forgotten} times: a tab starting then would not follow it`);
  await handshake(`TABS_LIVE ${TABS}`);

  const token = randomBytes(4).toString('hex');
  step(`fetch changes ${shared} and creates ${created}: every tab shows both`);
  await put(shared, `changed ${token}`);
  await put(created, token);
  const both = [[created, token], [shared, `changed ${token}`]];
  await waitForEveryTab(pages, 'the changes', (t) => showing(`changed ${token}`, both)(t) && t.watched.kind === 'set');

  // A tab watching a key of its own holds a stream of its own, until it closes.
  const alone = async (page, key) => {
    await page.getByLabel('Key to watch').fill(key);
    await page.getByRole('button', { name: 'Watch', exact: true }).click();
    await waitForRow(page, key, `${key} as absent`, (c) => c.kind === 'sync' && c.exists === 'false');
    await handshake(`TABS_ALONE ${key}`);
    await page.close();
    // The key list is kept for the next tab to open: as it was.
    await first.evaluate((keys) => localStorage.setItem('statestore-gateway.ui.keys', keys), JSON.stringify([shared]));
    await handshake(`TABS_ALONE_CLOSED ${key}`);
  };
  step('a tab without Web Locks (as in an insecure context) watches a key of its own, then closes');
  const unlocked = await session.context.newPage();
  await unlocked.addInitScript(() => Object.defineProperty(Navigator.prototype, 'locks', { value: undefined }));
  await loadPage(unlocked, base, problems);
  if (await unlocked.evaluate(() => navigator.locks !== undefined)) fail('the tab still has Web Locks');
  await alone(unlocked, 'ui-tabs/unlocked');
  step('a tab that never says goodbye watches a key of its own, then closes');
  const silent = await session.context.newPage();
  await silent.addInitScript(() => {
    const post = MessagePort.prototype.postMessage;
    MessagePort.prototype.postMessage = function postMessage(message, ...rest) {
      if (message?.type !== 'leave') post.call(this, message, ...rest);
    };
  });
  await loadPage(silent, base, problems);
  await alone(silent, 'ui-tabs/silent');

  step(`closing ${TABS - 1} tabs: the last stays live`);
  for (const page of pages.slice(1)) await page.close();
  await put(shared, `last ${token}`);
  await waitForEveryTab([first], 'the last change', showing(`last ${token}`, [[created, token], [shared, `last ${token}`]]));
  await handshake('TABS_ONE_LEFT');
  if (problems.length > 0) fail(problems.join('\n'));
  session.page = null;
  await first.close();
  await handshake('TABS_ALL_CLOSED');
  for (const key of [shared, created]) await expectStatus(await http('DELETE', keyUrl(key)), [204], `DELETE ${key}`);
}

/** Two tabs on one stream ride out a cut connection; see the top of this file. */
async function runReconnect(base, problems, session) {
  const key = 'ui-reconnect/key';
  await expectStatus(await http('PUT', new URL(`keys/${encodeURIComponent(key)}`, base), { body: 'before' }), [200], `PUT ${key}`);
  const first = await openPage(base, problems, session);
  await first.getByLabel('Key to watch').fill(key);
  await first.getByRole('button', { name: 'Watch', exact: true }).click();
  await waitForRow(first, key, `${key} = before`, (c) => c.value === 'before');
  const second = await session.context.newPage();
  await loadPage(second, base, problems);
  const pages = [first, second];
  const showing = (value) => (t) => t.connection === 'live' && t.watched?.key === key && t.watched.value === value;
  await waitForEveryTab(pages, `${key} = before, live`, showing('before'));
  await handshake('RECONNECT_LIVE');
  await waitForEveryTab(pages, 'that it is reconnecting', (t) => t.connection === 'reconnecting');
  await handshake('RECONNECT_DOWN');
  await waitForEveryTab(pages, 'the change made while cut off, live', showing('changed while cut off'));
  await handshake('RECONNECT_BACK');
  if (problems.length > 0) fail(problems.join('\n'));
}

async function main() {
  const problems = [];
  const session = {};
  let timer;
  const overall = new Promise((_, reject) => {
    const limit = LOAD_KEYS > 0 ? LOAD_OVERALL_MS : OVERALL_MS;
    timer = setTimeout(() => reject(new TestFailure(`the test did not finish within ${limit / 1000} s`)), limit);
  });
  try {
    const base = parseBase(process.argv[2]);
    const test = LOAD_KEYS > 0 ? runLoad : SDK_PEER ? runSdkPeer : TOPIC_PEER ? runTopicPeer : TABS > 0 ? runTabs : RECONNECT ? runReconnect : run;
    await Promise.race([test(base, problems, session), overall]);
    step('passed');
    return 0;
  } catch (err) {
    console.error(`ui test FAILED: ${err instanceof TestFailure ? err.message : err.stack}`);
    if (problems.length > 0) console.error(`ui test: page problems:\n  ${problems.join('\n  ')}`);
    if (session.page) {
      try {
        const dir = await mkdtemp(path.join(tmpdir(), 'ui-test-failure-'));
        const file = path.join(dir, 'page.png');
        await session.page.screenshot({ path: file, fullPage: true, timeout: 5_000 });
        console.error(`ui test: screenshot of the page: ${file}`);
      } catch (shotErr) {
        console.error(`ui test: no screenshot: ${shotErr.message}`);
      }
    }
    return 1;
  } finally {
    clearTimeout(timer);
    caller?.close();
    await session.context?.close().catch(() => {});
    if (session.userDataDir) await rm(session.userDataDir, { recursive: true, force: true }).catch(() => {});
  }
}

process.exitCode = await main();
