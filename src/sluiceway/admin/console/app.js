// The Sluiceway web console: polls the admin API (/api/v1) and draws what it returns.
//
// Plain JavaScript, no build step, nothing loaded from elsewhere. Every value from the broker goes
// into the page as text (textContent, attributes), never as HTML. Elements carry stable ids and
// data attributes (a destination's row: data-destination="/queue/orders"; its cells:
// data-field="msgs"; raw numbers in data-value) so that tests and scripts can read the page.
//
// Every request goes through the API's own rules: with authentication on, the browser sends the
// administrator's HTTP Basic credentials it was given for the page; requests that change
// something say Content-Type: application/json, which the API requires.
"use strict";

(() => {
  const API = "api/v1"; // relative to the page, so a path prefix added by a proxy is kept
  const REFRESH_MS = 2000; // one poll every 2 s: broker overview, tables, one chart point
  const HISTORY = 150; // points a chart keeps: the last 5 minutes at one point every 2 s
  // The list of destinations has no limits in it; they come from each destination's detail,
  // fetched when a destination first appears and again when older than this, a few per poll,
  // so a broker with many destinations costs a bounded number of requests per poll.
  const LIMITS_MAX_AGE_MS = 30000;
  const LIMITS_NEW_PER_POLL = 10;
  const LIMITS_STALE_PER_POLL = 2;
  // Open MQ's dead message queue: the broker refuses to pause it (purging it is allowed).
  const DMQ = "/queue/mq.sys.dmq";
  const TARGETS = ["ALL", "PRODUCERS", "CONSUMERS"]; // what Pause/Resume apply to

  const state = {
    selected: null, // path of the destination whose detail and chart are shown
    rows: new Map(), // path -> {tr, cells, data}: the destinations table
    connections: new Map(), // id -> {tr, cells}: the connections table
    limits: new Map(), // path -> {properties, at}: from the destinations' details
    timer: null,
    polling: false,
    again: false, // a poll was asked for while one ran: run another right after it
  };

  // -- the API --------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, body) {
      const detail = body && typeof body.detail === "string" ? body.detail : "";
      super(detail || `HTTP ${status}`);
      this.status = status;
      this.body = body;
    }
  }

  function apiUrl(path) {
    const url = new URL(API + path, document.baseURI);
    // A page opened as http://user:password@host/ may keep them in its own address; fetch()
    // refuses such URLs. The browser sends its cached credentials for the origin anyway.
    url.username = "";
    url.password = "";
    return url.href;
  }

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    const init = { method, headers, cache: "no-store", credentials: "same-origin" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(apiUrl(path), init);
    const text = await response.text();
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch (ignored) {
        data = null;
      }
    }
    if (!response.ok) {
      throw new ApiError(response.status, data);
    }
    return data;
  }

  function destinationPath(row) {
    return `/destinations/${encodeURIComponent(row.type)}/${encodeURIComponent(row.name)}`;
  }

  function describe(error) {
    if (error instanceof ApiError) {
      if (error.status === 401) {
        return "the broker did not accept the credentials (401); reload the page to log in";
      }
      if (error.status === 403) {
        return "this user is not an administrator (403)";
      }
      return `${error.message} (HTTP ${error.status})`;
    }
    return `the broker cannot be reached (${error.message})`;
  }

  // -- formatting -----------------------------------------------------------------------------

  const integer = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
  const decimal = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });

  function count(value) {
    return integer.format(value);
  }

  function bytes(value) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let size = Number(value);
    let unit = 0;
    while (Math.abs(size) >= 1024 && unit < units.length - 1) {
      size /= 1024;
      unit += 1;
    }
    return unit === 0 ? `${integer.format(size)} B` : `${decimal.format(size)} ${units[unit]}`;
  }

  function seconds(value) {
    const s = Number(value);
    if (s < 60) {
      return `${decimal.format(s)} s`;
    }
    if (s < 3600) {
      return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
    }
    if (s < 86400) {
      return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
    }
    return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  }

  function limit(text, asBytes) {
    if (text === undefined) {
      return "…";
    }
    const value = Number(text);
    if (text === "-1" || Number.isNaN(value)) {
      return text === "-1" ? "unlimited" : text;
    }
    return asBytes ? bytes(value) : count(value);
  }

  function yesNo(flag) {
    return flag ? "yes" : "no";
  }

  // -- the DOM (text only) --------------------------------------------------------------------

  function $(id) {
    return document.getElementById(id);
  }

  function make(tag, options = {}, children = []) {
    const node = document.createElement(tag);
    if (options.className) node.className = options.className;
    if (options.text !== undefined) node.textContent = options.text;
    if (options.title) node.title = options.title;
    if (options.type) node.type = options.type;
    for (const [key, value] of Object.entries(options.data || {})) {
      node.dataset[key] = value;
    }
    for (const child of children) {
      node.appendChild(child);
    }
    return node;
  }

  function setText(node, text) {
    const value = String(text);
    if (node.textContent !== value) {
      node.textContent = value;
    }
  }

  // A cell that shows `text` for the raw `value` (kept in data-value for scripts and tests).
  function setField(node, value, text, title) {
    const raw = value === null || value === undefined ? "" : String(value);
    if (node.dataset.value !== raw) {
      node.dataset.value = raw;
    }
    setText(node, text);
    if (title !== undefined && node.title !== title) {
      node.title = title;
    }
  }

  function showMessage(kind, text) {
    const box = $("message");
    box.dataset.kind = kind;
    setText($("message-text"), text);
    box.hidden = false;
  }

  function setStatus(kind, text) {
    const status = $("status");
    status.dataset.state = kind;
    setText(status, text);
  }

  // -- the broker overview --------------------------------------------------------------------

  function renderOverview(broker) {
    setText($("broker-version"), `${broker.version}`);
    setText($("broker-instance"), `instance ${broker.instance}`);
    const memory = broker.memory;
    const level = $("memory-level");
    level.dataset.level = memory.level;
    setText(level, memory.level);
    const share = memory.budget > 0 ? memory.used / memory.budget : 0;
    const percent = Math.min(100, share * 100);
    const fill = $("memory-fill");
    fill.style.width = `${percent.toFixed(2)}%`;
    fill.dataset.level = memory.level;
    const use = $("memory-use");
    use.dataset.used = String(memory.used);
    use.dataset.budget = String(memory.budget);
    setText(use, `${bytes(memory.used)} of ${bytes(memory.budget)} (${decimal.format(share * 100)}%)`);
    const thresholds = Object.entries(memory.thresholds)
      .filter(([, value]) => value > 0)
      .map(([name, value]) => `${name} at ${value}%`)
      .join(", ");
    const swap = memory.swap_point > 0 ? `; swapping above ${bytes(memory.swap_point)}` : "";
    setText(
      $("memory-detail"),
      `peak ${bytes(memory.peak)}; write buffers ${bytes(memory.external)}; ${thresholds}${swap}`,
    );
    setField($("broker-msgs"), broker.msgs, count(broker.msgs));
    setText($("broker-msg-bytes"), bytes(broker.msg_bytes));
    setField($("broker-dmq-msgs"), broker.dmq_msgs, `${count(broker.dmq_msgs)} messages`);
    setField($("broker-connections"), broker.connections, count(broker.connections));
    setText($("broker-destinations"), count(broker.destinations));
    setText($("broker-uptime"), seconds(broker.uptime));
    setField($("broker-held-producers"), broker.held_producers, count(broker.held_producers));
    setField($("broker-throttled-count"), broker.throttled.length, count(broker.throttled.length));
    setText($("broker-throttled"), broker.throttled.length ? broker.throttled.join(", ") : "none");
  }

  // -- the destinations table -----------------------------------------------------------------

  // Flow-control state per destination: consumers whose window is used up (from /consumers) and
  // held producers with their reasons (from /producers): two requests for all destinations.
  function flowState(consumers, producers) {
    const found = new Map();
    const entry = (path) => {
      if (!found.has(path)) {
        found.set(path, { paused: 0, longest: 0, held: [] });
      }
      return found.get(path);
    };
    for (const consumer of consumers) {
      if (consumer.flow_paused_for !== null && consumer.flow_paused_for !== undefined) {
        const flow = entry(consumer.destination);
        flow.paused += 1;
        flow.longest = Math.max(flow.longest, consumer.flow_paused_for);
      }
    }
    for (const producer of producers) {
      entry(producer.destination).held.push(producer);
    }
    return found;
  }

  const NUMERIC_FIELDS = ["producers", "msgs", "pending", "unacked"];

  function buildDestinationRow(row) {
    const cells = {};
    const cell = (field, className) => {
      cells[field] = make("td", { className, data: { field } });
      return cells[field];
    };
    const tr = make("tr", { data: { destination: row.path, type: row.type, name: row.name } });
    const name = make("td", { className: "name", data: { field: "path" } });
    const select = make("button", {
      className: "link",
      type: "button",
      text: row.path,
      title: "show this destination's detail and chart",
      data: { action: "select" },
    });
    name.appendChild(select);
    cells.path = name;
    tr.appendChild(name);
    tr.appendChild(cell("state", "state"));
    tr.appendChild(cell("producers", "num"));
    tr.appendChild(cell("consumers", "num"));
    tr.appendChild(cell("pipeline_readers", "num"));
    for (const field of ["msgs", "pending", "unacked", "msg_bytes", "avg_size"]) {
      tr.appendChild(cell(field, "num"));
    }
    tr.appendChild(cell("maxNumMsgs", "num"));
    tr.appendChild(cell("maxTotalMsgBytes", "num"));
    tr.appendChild(cell("limitBehavior"));
    const consumersFlow = make("td", { data: { field: "flow_consumers" } });
    cells.paused_consumers = make("span", { className: "count", data: { field: "paused_consumers" } });
    cells.longest_pause = make("span", { className: "muted", data: { field: "longest_pause" } });
    consumersFlow.append(cells.paused_consumers, " ", cells.longest_pause);
    tr.appendChild(consumersFlow);
    const producersFlow = make("td", { data: { field: "flow_producers" } });
    cells.held_producers = make("span", { className: "count", data: { field: "held_producers" } });
    cells.held_reason = make("span", { className: "reason", data: { field: "held_reason" } });
    producersFlow.append(cells.held_producers, " ", cells.held_reason);
    tr.appendChild(producersFlow);
    tr.appendChild(cell("held_sends", "num"));
    tr.appendChild(cell("throttled"));

    const actions = make("td", { className: "actions", data: { field: "actions" } });
    const target = make("select", {
      title: "what Pause and Resume apply to",
      data: { action: "target" },
    });
    target.setAttribute("aria-label", `pause or resume target for ${row.path}`);
    for (const value of TARGETS) {
      target.appendChild(make("option", { text: value.toLowerCase() }));
      target.lastChild.value = value;
    }
    const dmq = row.path === DMQ;
    const pause = make("button", { type: "button", text: "Pause", data: { action: "pause" } });
    const resume = make("button", { type: "button", text: "Resume", data: { action: "resume" } });
    const purge = make("button", {
      type: "button",
      text: "Purge",
      className: "danger",
      title: "remove every message waiting for a consumer",
      data: { action: "purge" },
    });
    if (dmq) {
      for (const control of [target, pause, resume]) {
        control.disabled = true;
        control.title = "the dead message queue cannot be paused";
        control.dataset.never = "true";
      }
    }
    actions.append(target, pause, resume, purge);
    tr.appendChild(actions);
    return { tr, cells, data: row };
  }

  function renderDestinationRow(entry, row, flow) {
    const { tr, cells } = entry;
    entry.data = row;
    if (tr.dataset.state !== row.state) {
      tr.dataset.state = row.state;
    }
    setField(cells.state, row.state, row.state);
    cells.state.dataset.state = row.state;
    for (const field of NUMERIC_FIELDS) {
      setField(cells[field], row[field], count(row[field]));
    }
    const backups = row.backup_consumers ? ` + ${count(row.backup_consumers)} backup` : "";
    const readers = row.pipeline_readers;
    const drained = readers ? `; drained by ${readers} pipeline reader${readers === 1 ? "" : "s"}` : "";
    setField(
      cells.consumers,
      row.consumers,
      `${count(row.active_consumers)}${backups}`,
      `${row.active_consumers} active, ${row.backup_consumers} backup${drained}`,
    );
    setField(
      cells.pipeline_readers,
      readers,
      count(readers),
      "cursor groups of a topic, lease groups of a queue: select the destination for their lag",
    );
    setField(cells.msg_bytes, row.msg_bytes, bytes(row.msg_bytes));
    setField(cells.avg_size, row.avg_size, bytes(row.avg_size));
    renderLimits(entry);
    const paused = flow ? flow.paused : 0;
    setField(cells.paused_consumers, paused, count(paused));
    if (paused) {
      setField(cells.longest_pause, flow.longest, `longest ${seconds(flow.longest)}`);
    } else {
      setField(cells.longest_pause, "", "");
    }
    const held = flow ? flow.held : [];
    setField(cells.held_producers, held.length, count(held.length));
    const reasons = [...new Set(held.map((h) => h.reason))].join("; ");
    const details = held.map((h) => `connection ${h.connection}: ${h.detail}`).join("\n");
    setField(cells.held_reason, reasons, reasons, details);
    setField(cells.held_sends, row.held_sends, count(row.held_sends));
    setField(cells.throttled, row.throttled, yesNo(row.throttled));
    cells.throttled.classList.toggle("warn", row.throttled);
    tr.classList.toggle("flow", paused > 0 || held.length > 0);
  }

  function renderLimits(entry) {
    const known = state.limits.get(entry.data.path);
    const properties = known ? known.properties : {};
    const { cells } = entry;
    setField(cells.maxNumMsgs, properties.maxNumMsgs, limit(properties.maxNumMsgs, false));
    setField(
      cells.maxTotalMsgBytes,
      properties.maxTotalMsgBytes,
      limit(properties.maxTotalMsgBytes, true),
    );
    const behavior = properties.limitBehavior;
    setField(cells.limitBehavior, behavior, behavior === undefined ? "…" : behavior);
  }

  function renderDestinations(rows, flows) {
    const body = $("destinations-body");
    const seen = new Set();
    rows.forEach((row, index) => {
      seen.add(row.path);
      let entry = state.rows.get(row.path);
      if (entry === undefined) {
        entry = buildDestinationRow(row);
        state.rows.set(row.path, entry);
      }
      renderDestinationRow(entry, row, flows.get(row.path));
      if (body.children[index] !== entry.tr) {
        body.insertBefore(entry.tr, body.children[index] || null);
      }
    });
    for (const [path, entry] of state.rows) {
      if (!seen.has(path)) {
        entry.tr.remove();
        state.rows.delete(path);
      }
    }
    $("destinations-empty").hidden = rows.length > 0;
    markSelected();
  }

  function markSelected() {
    for (const [path, entry] of state.rows) {
      const selected = path === state.selected;
      entry.tr.classList.toggle("selected", selected);
      if (selected) {
        entry.tr.dataset.selected = "true";
      } else {
        delete entry.tr.dataset.selected;
      }
    }
  }

  // -- the selected destination ---------------------------------------------------------------

  function definitionList(list, entries) {
    const items = [];
    for (const [name, value] of entries) {
      items.push(make("dt", { text: name }), make("dd", { text: value, data: { field: name } }));
    }
    list.replaceChildren(...items);
  }

  function tableRows(table, rows) {
    const body = table.tBodies[0];
    body.replaceChildren(
      ...rows.map((cells) => make("tr", {}, cells.map((text) => make("td", { text: String(text) })))),
    );
  }

  function windowText(c) {
    const size = c.window_limit < 0 ? "unlimited" : count(c.window_limit);
    return c.window_auto ? `${size} (auto, max ${count(c.window_max)})` : size;
  }

  function milliseconds(value) {
    return value === null || value === undefined ? "-" : `${decimal.format(value)} ms`;
  }

  // Every consumer of the destination with its window as it is now; an adaptive one's window
  // (consumerFlowLimit=auto) says so, with its maximum and what it was sized from.
  function renderConsumers(consumers) {
    const table = $("detail-consumers");
    table.tBodies[0].replaceChildren(
      ...consumers.map((c) =>
        make("tr", { data: { connection: c.connection, subscription: c.id } }, [
          make("td", { text: String(c.connection) }),
          make("td", { text: c.id }),
          make("td", {
            text: windowText(c),
            data: { field: "window", value: c.window_limit, auto: c.window_auto },
          }),
          make("td", {
            text: count(c.outstanding),
            data: { field: "outstanding", value: c.outstanding },
          }),
          make("td", {
            text: milliseconds(c.pace_ms),
            data: { field: "pace", value: c.pace_ms ?? "" },
          }),
          make("td", {
            text: milliseconds(c.round_trip_ms),
            data: { field: "round_trip", value: c.round_trip_ms ?? "" },
          }),
        ]),
      ),
    );
    $("detail-consumers-empty").hidden = consumers.length > 0;
  }

  function renderDetail(detail) {
    $("destination-detail").hidden = false;
    setText($("detail-path"), detail.summary.path);
    definitionList($("detail-properties"), Object.entries(detail.properties));
    const totals = Object.entries(detail.totals).map(([name, value]) => [
      name,
      name.startsWith("bytes") ? bytes(value) : count(value),
    ]);
    if (detail.trend) {
      totals.push(["msgs peak", count(detail.trend.msgs_peak)]);
      totals.push(["msgs average", decimal.format(detail.trend.msgs_avg)]);
      totals.push(["largest message", bytes(detail.trend.largest_msg)]);
    }
    definitionList($("detail-totals"), totals);
    renderReaders(detail.readers);
    renderConsumers(detail.consumers);
    tableRows(
      $("detail-paused-consumers"),
      detail.paused_consumers.map((c) => [
        c.connection,
        c.id,
        c.window_limit < 0 ? "unlimited" : count(c.window_limit),
        count(c.outstanding),
        count(c.unacked),
        seconds(c.flow_paused_for),
      ]),
    );
    tableRows(
      $("detail-held-producers"),
      detail.held_producers.map((h) => [
        h.connection,
        h.reason,
        h.limit || "",
        count(h.held_sends),
        bytes(h.held_bytes),
        h.detail,
      ]),
    );
  }

  // A destination's pipeline readers: one row each (data-group, data-kind), cells by field.
  const READER_COLUMNS = [
    ["kind", String],
    ["group", String],
    ["lag_messages", count],
    ["lag_seconds", seconds],
    ["position", count],
    ["open_leases", count],
    ["leased_messages", count],
  ];

  function renderReaders(readers) {
    $("detail-readers").tBodies[0].replaceChildren(
      ...readers.map((reader) => {
        const tr = make("tr", { data: { group: reader.group, kind: reader.kind } });
        for (const [field, format] of READER_COLUMNS) {
          const value = reader[field];
          const td = make("td", { data: { field } });
          setField(td, value, value === null ? "-" : format(value));
          tr.appendChild(td);
        }
        return tr;
      }),
    );
    $("detail-readers-empty").hidden = readers.length > 0;
  }

  function rememberDetail(detail) {
    const path = detail.summary.path;
    state.limits.set(path, { properties: detail.properties, at: Date.now() });
    const entry = state.rows.get(path);
    if (entry !== undefined) {
      renderLimits(entry);
    }
  }

  // Details for the limits columns (a few per poll) and for the selected destination.
  async function refreshDetails(rows) {
    const now = Date.now();
    const byPath = new Map(rows.map((row) => [row.path, row]));
    for (const path of [...state.limits.keys()]) {
      if (!byPath.has(path)) state.limits.delete(path);
    }
    const wanted = new Map();
    rows
      .filter((row) => !state.limits.has(row.path))
      .slice(0, LIMITS_NEW_PER_POLL)
      .forEach((row) => wanted.set(row.path, row));
    rows
      .filter((row) => state.limits.has(row.path))
      .filter((row) => now - state.limits.get(row.path).at > LIMITS_MAX_AGE_MS)
      .sort((a, b) => state.limits.get(a.path).at - state.limits.get(b.path).at)
      .slice(0, LIMITS_STALE_PER_POLL)
      .forEach((row) => wanted.set(row.path, row));
    if (state.selected !== null && !byPath.has(state.selected)) {
      select(null); // destroyed, or auto-destroyed when it emptied
    }
    if (state.selected !== null) {
      wanted.set(state.selected, byPath.get(state.selected));
    }
    const details = await Promise.all(
      [...wanted.values()].map((row) =>
        api("GET", destinationPath(row)).catch((error) => {
          if (error instanceof ApiError && error.status === 404) return null; // just gone
          throw error;
        }),
      ),
    );
    for (const detail of details) {
      if (detail === null) continue;
      rememberDetail(detail);
      if (detail.summary.path === state.selected) {
        renderDetail(detail);
        const rates = detail.trend ? detail.trend.rates : { msgs_in: 0, msgs_out: 0 };
        charts.destination.push(rates.msgs_in, rates.msgs_out);
      }
    }
  }

  function select(path) {
    if (path === state.selected) return;
    state.selected = path;
    charts.destination.reset();
    if (path === null) {
      $("destination-detail").hidden = true;
      setText($("chart-destination-title"), "Destination: choose one in the table");
      history.replaceState(null, "", location.pathname + location.search);
    } else {
      setText($("chart-destination-title"), `Destination ${path}`);
      history.replaceState(null, "", `#${path}`);
    }
    markSelected();
  }

  // -- actions --------------------------------------------------------------------------------

  async function act(action, entry) {
    const row = entry.data;
    const target = entry.tr.querySelector('select[data-action="target"]').value;
    if (action === "purge") {
      const question =
        `Purge ${row.path}? Every message waiting for a consumer ` +
        `(${count(row.pending)} now) is removed for good.`;
      if (!window.confirm(question)) return;
    }
    const buttons = entry.tr.querySelectorAll("button[data-action], select[data-action]");
    for (const control of buttons) control.disabled = true;
    entry.tr.dataset.busy = "true";
    try {
      if (action === "purge") {
        const result = await api("POST", `${destinationPath(row)}/purge`, {});
        showMessage("info", `Purged ${count(result.purged)} messages from ${result.destination}.`);
      } else {
        const detail = await api("POST", `${destinationPath(row)}/${action}`, { target });
        rememberDetail(detail);
        const done = action === "pause" ? "paused" : "resumed";
        showMessage(
          "info",
          `${detail.summary.path}: ${target.toLowerCase()} ${done}; now ${detail.summary.state}.`,
        );
      }
    } catch (error) {
      showMessage("error", `${action} ${row.path} failed: ${describe(error)}`);
    } finally {
      for (const control of buttons) {
        if (control.dataset.never !== "true") control.disabled = false;
      }
      delete entry.tr.dataset.busy;
      poll(); // show the result now rather than at the next poll
    }
  }

  function onTableClick(event) {
    const button = event.target.closest("button[data-action]");
    const tr = event.target.closest("tr[data-destination]");
    if (button === null || tr === null) return;
    const entry = state.rows.get(tr.dataset.destination);
    if (entry === undefined) return;
    if (button.dataset.action === "select") {
      select(entry.data.path);
      poll();
    } else {
      act(button.dataset.action, entry);
    }
  }

  // -- the connections table ------------------------------------------------------------------

  const CONNECTION_COLUMNS = [
    ["id", String],
    ["service", String],
    ["peer", String],
    ["user", String],
    ["client_id", String],
    ["state", String],
    ["version", String],
    ["subscriptions", count],
    ["producers", count],
    ["outstanding", count],
    ["held_sends", count],
    ["held_reason", String],
    ["write_buffer", bytes],
    ["reading_paused", yesNo],
    ["writing_paused", yesNo],
    ["connected_for", seconds],
  ];

  function renderConnections(rows) {
    const body = $("connections-body");
    const seen = new Set();
    rows.forEach((row, index) => {
      const key = String(row.id);
      seen.add(key);
      let entry = state.connections.get(key);
      if (entry === undefined) {
        const cells = {};
        const tr = make("tr", { data: { connection: key } });
        for (const [field] of CONNECTION_COLUMNS) {
          cells[field] = make("td", { data: { field } });
          tr.appendChild(cells[field]);
        }
        entry = { tr, cells };
        state.connections.set(key, entry);
      }
      for (const [field, format] of CONNECTION_COLUMNS) {
        setField(entry.cells[field], row[field], format(row[field]));
      }
      entry.tr.classList.toggle("flow", row.held_sends > 0 || row.reading_paused);
      if (body.children[index] !== entry.tr) {
        body.insertBefore(entry.tr, body.children[index] || null);
      }
    });
    for (const [key, entry] of state.connections) {
      if (!seen.has(key)) {
        entry.tr.remove();
        state.connections.delete(key);
      }
    }
  }

  // -- the cluster ----------------------------------------------------------------------------

  const CLUSTER_COLUMNS = [
    ["broker_id", String],
    ["address", String],
    ["state", String],
    ["epoch", count],
    ["msgs", count],
    ["taken_over_by", (value) => value || "-"],
    ["heartbeat_age", (value) => (value === null ? "-" : `${decimal.format(value)} s ago`)],
  ];
  const CLUSTER_EVENTS = 5; // the newest events shown under the members

  // Shown only for a member of a cluster (imq.cluster.ha); a handful of rows, drawn anew.
  function renderCluster(view) {
    $("cluster").hidden = !view.ha;
    if (!view.ha) return;
    setText($("cluster-id"), view.cluster_id ? `cluster ${view.cluster_id}` : "");
    $("cluster-body").replaceChildren(
      ...view.members.map((member) => {
        const tr = make("tr", { data: { broker: member.broker_id, state: member.state } });
        tr.classList.toggle("this-broker", member.this_broker);
        for (const [field, format] of CLUSTER_COLUMNS) {
          const td = make("td", { data: { field } });
          setField(td, member[field], format(member[field]));
          tr.appendChild(td);
        }
        return tr;
      }),
    );
    $("cluster-events").replaceChildren(
      ...view.events.slice(0, CLUSTER_EVENTS).map((event) =>
        make("li", {
          text: `${new Date(event.at).toLocaleTimeString()} ${event.broker_id} ${event.kind}: ${event.detail}`,
          data: { kind: event.kind },
        }),
      ),
    );
  }

  // -- rate charts ----------------------------------------------------------------------------

  // Messages in and out per second, one point per poll, on a <canvas>. It keeps the last
  // HISTORY points; data-points says how many it has, data-last-in/out the newest values and
  // data-peak-in/out the largest kept.
  class RateChart {
    constructor(canvas) {
      this.canvas = canvas;
      this.points = [];
      this.draw();
    }

    reset() {
      this.points = [];
      this.draw();
    }

    push(rateIn, rateOut) {
      this.points.push([Number(rateIn) || 0, Number(rateOut) || 0]);
      if (this.points.length > HISTORY) {
        this.points.splice(0, this.points.length - HISTORY);
      }
      this.draw();
    }

    draw() {
      const canvas = this.canvas;
      const ratio = window.devicePixelRatio || 1;
      const width = canvas.clientWidth || 300;
      const height = canvas.clientHeight || 150;
      if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
      if (canvas.height !== Math.round(height * ratio)) canvas.height = Math.round(height * ratio);
      const context = canvas.getContext("2d");
      context.setTransform(ratio, 0, 0, ratio, 0, 0);
      context.clearRect(0, 0, width, height);
      const style = getComputedStyle(document.documentElement);
      const colour = (name, fallback) => style.getPropertyValue(name).trim() || fallback;
      const peakIn = Math.max(0, ...this.points.map((p) => p[0]));
      const peakOut = Math.max(0, ...this.points.map((p) => p[1]));
      const top = niceCeiling(Math.max(peakIn, peakOut));
      const box = { left: 44, right: width - 6, top: 8, bottom: height - 16 };
      // Grid: 0, half and the top of the scale, labelled in messages per second.
      context.font = "11px system-ui, sans-serif";
      context.textAlign = "right";
      context.textBaseline = "middle";
      context.lineWidth = 1;
      for (const fraction of [0, 0.5, 1]) {
        const y = box.bottom - fraction * (box.bottom - box.top);
        context.strokeStyle = colour("--grid", "#d0d7de");
        context.beginPath();
        context.moveTo(box.left, Math.round(y) + 0.5);
        context.lineTo(box.right, Math.round(y) + 0.5);
        context.stroke();
        context.fillStyle = colour("--muted", "#57606a");
        context.fillText(decimal.format(top * fraction), box.left - 6, y);
      }
      context.textAlign = "left";
      context.textBaseline = "alphabetic";
      context.fillText(`${Math.round((HISTORY * REFRESH_MS) / 60000)} min`, box.left, height - 3);
      context.textAlign = "right";
      context.fillText("now", box.right, height - 3);
      // The newest point sits at the right edge; older ones move left.
      const step = (box.right - box.left) / Math.max(1, HISTORY - 1);
      const series = [
        [0, colour("--rate-in", "#1f6feb")],
        [1, colour("--rate-out", "#d1242f")],
      ];
      for (const [index, stroke] of series) {
        if (this.points.length === 0) continue;
        context.strokeStyle = stroke;
        context.lineWidth = 2;
        context.beginPath();
        this.points.forEach((point, i) => {
          const x = box.right - (this.points.length - 1 - i) * step;
          const y = box.bottom - (point[index] / top) * (box.bottom - box.top);
          if (i === 0) context.moveTo(x, y);
          else context.lineTo(x, y);
        });
        if (this.points.length === 1) {
          context.lineTo(box.right - 0.5, box.bottom - (this.points[0][index] / top) * (box.bottom - box.top));
        }
        context.stroke();
      }
      const last = this.points[this.points.length - 1] || [0, 0];
      canvas.dataset.points = String(this.points.length);
      canvas.dataset.lastIn = String(last[0]);
      canvas.dataset.lastOut = String(last[1]);
      canvas.dataset.peakIn = String(peakIn);
      canvas.dataset.peakOut = String(peakOut);
      canvas.dataset.scale = String(top);
    }
  }

  // The smallest 1, 2 or 5 times a power of ten at or above `value` (at least 1).
  function niceCeiling(value) {
    if (!(value > 1)) return 1;
    const power = 10 ** Math.floor(Math.log10(value));
    for (const step of [1, 2, 5, 10]) {
      if (step * power >= value) return step * power;
    }
    return 10 * power;
  }

  let charts = null;

  // -- polling --------------------------------------------------------------------------------

  function schedule(delay) {
    clearTimeout(state.timer);
    state.timer = setTimeout(poll, delay);
  }

  async function poll() {
    if (state.polling) {
      state.again = true;
      return;
    }
    if (document.hidden) {
      schedule(REFRESH_MS); // nobody is looking: ask nothing of the broker
      return;
    }
    state.polling = true;
    state.again = false;
    clearTimeout(state.timer);
    try {
      const [broker, destinations, consumers, producers, connections, metrics, cluster] = await Promise.all([
        api("GET", "/broker"),
        api("GET", "/destinations"),
        api("GET", "/consumers"),
        api("GET", "/producers"),
        api("GET", "/connections"),
        api("GET", "/metrics/broker"),
        api("GET", "/cluster"),
      ]);
      renderOverview(broker);
      renderCluster(cluster);
      renderDestinations(destinations, flowState(consumers, producers));
      renderConnections(connections);
      charts.broker.push(metrics.rates.msgs_in, metrics.rates.msgs_out);
      await refreshDetails(destinations);
      setStatus("ok", `Updated ${new Date().toLocaleTimeString()}`);
    } catch (error) {
      setStatus("error", `Not updated: ${describe(error)}`);
    } finally {
      state.polling = false;
      schedule(state.again ? 0 : REFRESH_MS);
    }
  }

  function start() {
    charts = {
      broker: new RateChart($("chart-broker")),
      destination: new RateChart($("chart-destination")),
    };
    setText(
      $("chart-window"),
      `one point every ${REFRESH_MS / 1000} s, the last ${Math.round((HISTORY * REFRESH_MS) / 60000)} minutes`,
    );
    $("destinations-body").addEventListener("click", onTableClick);
    $("message-close").addEventListener("click", () => {
      $("message").hidden = true;
    });
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) poll();
    });
    window.addEventListener("resize", () => {
      charts.broker.draw();
      charts.destination.draw();
    });
    const fromAddress = decodeURIComponent(location.hash.slice(1));
    if (fromAddress.startsWith("/")) select(fromAddress);
    poll();
  }

  start();
})();
