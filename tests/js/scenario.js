// One scenario of the official JavaScript SDK (@azure/service-bus) against `oncebus serve`.
// Usage: node scenario.js <name> [argument]; run by tests/js/test_js_sdk.py, which starts the server and sets:
//   ONCEBUS_CONNECTION_STRING  the connection string `oncebus serve` printed (a key with all rights)
//   ONCEBUS_SEND_ONLY, ONCEBUS_LISTEN_ONLY  connection strings with a Send-only and a Listen-only key
//   NODE_EXTRA_CA_CERTS  the server's CA file (the admin client speaks HTTPS)
//   ONCEBUS_SCENARIO_FILE, ONCEBUS_CLOCK_FILE  for the shared dedup scenarios (dedup.js)
// Prints one JSON line with what it saw; exits 1 (with the error) when something the scenario expects fails.
"use strict";

const { ServiceBusClient, ServiceBusAdministrationClient } = require("@azure/service-bus");
// 7.10.0-beta.2 (package.json's alias): the first JavaScript SDK with deleteMessages and purgeMessages
const beta = require("@azure/service-bus-beta");
const { runDedupScenario } = require("./dedup");

const connectionString = process.env.ONCEBUS_CONNECTION_STRING;
const retryOptions = { maxRetries: 0, timeoutInMs: 15000 };

function expect(condition, what) {
  if (!condition) throw new Error(`expected ${what}`);
}

async function withClient(text, work) {
  const client = new ServiceBusClient(text, { retryOptions });
  try {
    return await work(client);
  } finally {
    await client.close();
  }
}

async function refused(work) {
  try {
    await work();
  } catch (error) {
    return `${error.code || error.name}: ${error.message}`;
  }
  return null;
}

const scenarios = {
  // one of the shared duplicate-detection scenarios (dedup.js), named by the next argument
  async "shared-dedup"() {
    return runDedupScenario(process.argv[3]);
  },

  // send, receive, complete
  async "send-receive"() {
    const body = `js-${Date.now()}`;
    return withClient(connectionString, async (client) => {
      const sender = client.createSender("js-plain");
      await sender.sendMessages({ body, messageId: body });
      const receiver = client.createReceiver("js-plain");
      const got = await receiver.receiveMessages(10, { maxWaitTimeInMs: 5000 });
      for (const message of got) await receiver.completeMessage(message);
      expect(got.some((m) => m.body === body), `to receive ${body}`);
      return { received: got.map((m) => m.body) };
    });
  },

  // the same message id twice inside the window: the second is dropped
  async dedup() {
    const id = `dup-${Date.now()}`;
    return withClient(connectionString, async (client) => {
      const sender = client.createSender("js-dedup");
      await sender.sendMessages({ body: "first", messageId: id });
      await sender.sendMessages({ body: "second", messageId: id });
      const receiver = client.createReceiver("js-dedup", { receiveMode: "receiveAndDelete" });
      const got = await receiver.receiveMessages(10, { maxWaitTimeInMs: 3000 });
      expect(got.length === 1 && got[0].body === "first", `one message 'first', got ${JSON.stringify(got.map((m) => m.body))}`);
      return { received: got.map((m) => m.body) };
    });
  },

  // scheduleMessages on a fresh sender and peekMessages on a fresh receiver: the SDK puts a token for
  // sb://host/<queue>/$management before it uses that node
  async "schedule-peek"() {
    const later = new Date(Date.now() + 3600 * 1000);
    const numbers = await withClient(connectionString, async (client) => {
      const sender = client.createSender("js-sched");
      return sender.scheduleMessages({ body: "later", messageId: `sched-${Date.now()}` }, later);
    });
    expect(numbers.length === 1, "one sequence number");
    const peeked = await withClient(connectionString, async (client) => {
      const receiver = client.createReceiver("js-sched");
      return receiver.peekMessages(10);
    });
    expect(peeked.some((m) => m.body === "later"), "to peek the scheduled message");
    await withClient(connectionString, async (client) => {
      await client.createSender("js-sched").cancelScheduledMessages(numbers);
    });
    return { scheduled: numbers.map(String), peeked: peeked.length };
  },

  // the administration client over HTTPS: every call signs with sr = the request URL
  async admin() {
    const admin = new ServiceBusAdministrationClient(connectionString);
    const seen = {};
    const names = async (pages) => {
      const out = [];
      for await (const item of pages) out.push(item.name ?? item.subscriptionName);
      return out;
    };
    seen.namespace = (await admin.getNamespaceProperties()).name;
    const queue = `js-adm-${Date.now()}`;
    await admin.createQueue(queue, { requiresDuplicateDetection: true });
    seen.getQueue = (await admin.getQueue(queue)).requiresDuplicateDetection;
    seen.queues = (await names(admin.listQueues())).includes(queue);
    await admin.createTopic(`${queue}-t`);
    await admin.createSubscription(`${queue}-t`, "red");
    seen.topics = (await names(admin.listTopics())).includes(`${queue}-t`);
    seen.subscriptions = await names(admin.listSubscriptions(`${queue}-t`));
    await admin.createRule(`${queue}-t`, "red", "red-only", { sqlExpression: "color = 'red'" });
    seen.getRule = (await admin.getRule(`${queue}-t`, "red", "red-only")).name;
    seen.rules = await names(admin.listRules(`${queue}-t`, "red"));
    seen.runtime = (await admin.getQueueRuntimeProperties(queue)).name;
    await admin.deleteQueue(queue);
    await admin.deleteTopic(`${queue}-t`);
    expect(seen.getQueue === true && seen.queues && seen.topics, "the queue and topic listed");
    expect(seen.subscriptions.includes("red") && seen.rules.includes("red-only"), `the subscription and rule listed: ${JSON.stringify(seen)}`);
    return seen;
  },

  // a Send-only key sends but cannot receive; a Listen-only key the reverse; neither manages
  async rights() {
    const body = `rights-${Date.now()}`;
    const out = {};
    await withClient(process.env.ONCEBUS_SEND_ONLY, async (client) => {
      await client.createSender("js-plain").sendMessages({ body, messageId: body });
      out.sendOnlyReceive = await refused(() => client.createReceiver("js-plain").receiveMessages(1, { maxWaitTimeInMs: 2000 }));
    });
    await withClient(process.env.ONCEBUS_LISTEN_ONLY, async (client) => {
      out.listenOnlySend = await refused(() => client.createSender("js-plain").sendMessages({ body: "nope" }));
      const receiver = client.createReceiver("js-plain");
      const got = await receiver.receiveMessages(10, { maxWaitTimeInMs: 5000 });
      for (const message of got) await receiver.completeMessage(message);
      out.listenOnlyReceived = got.some((m) => m.body === body);
    });
    out.listenOnlyManage = await refused(() => new ServiceBusAdministrationClient(process.env.ONCEBUS_LISTEN_ONLY).getQueue("js-plain"));
    expect(out.sendOnlyReceive && out.listenOnlySend && out.listenOnlyManage, "three refusals");
    expect(out.listenOnlyReceived, "the Listen-only key to receive what the Send-only key sent");
    return out;
  },

  // a subscription's rules through the rule manager (add-rule, remove-rule, enumerate-rules on its $management node),
  // then what the rules let through; a Listen-only key cannot change rules
  async "rules-amqp"() {
    const out = {};
    await withClient(connectionString, async (client) => {
      const rules = client.createRuleManager("js-rules", "sub");
      const names = async () => {
        const found = [];
        for await (const rule of rules.listRules()) found.push(rule);
        return found;
      };
      out.initial = (await names()).map((r) => r.name);
      await rules.deleteRule("$Default");
      await rules.createRule("red", { sqlExpression: "color = 'red'" }, { sqlExpression: "SET seen = 'yes'" });
      await rules.createRule("vip", { correlationId: "vip-1", applicationProperties: { tier: 3 } });
      out.duplicate = await refused(() => rules.createRule("RED", { sqlExpression: "1=1" }));
      out.badSql = await refused(() => rules.createRule("bad", { sqlExpression: "color = " }));
      out.missing = await refused(() => rules.deleteRule("nothing-here"));
      out.rules = (await names()).map((r) => ({ name: r.name, filter: r.filter, action: r.action }));
      const sender = client.createSender("js-rules");
      await sender.sendMessages([
        { body: "red", applicationProperties: { color: "red" } },
        { body: "blue", applicationProperties: { color: "blue" } },
        { body: "vip", correlationId: "vip-1", applicationProperties: { tier: 3 } },
      ]);
      const receiver = client.createReceiver("js-rules", "sub", { receiveMode: "receiveAndDelete" });
      const got = [];
      while (got.length < 3) {
        const batch = await receiver.receiveMessages(10, { maxWaitTimeInMs: 1500 });
        if (batch.length === 0) break;
        got.push(...batch);
      }
      out.received = got.map((m) => [m.body, m.applicationProperties.seen ?? null]).sort();
    });
    await withClient(process.env.ONCEBUS_LISTEN_ONLY, async (client) => {
      out.listenOnly = await refused(() =>
        client.createRuleManager("js-rules", "sub").createRule("sneaky", { sqlExpression: "1=1" }),
      );
    });
    return out;
  },

  // deleteMessages / purgeMessages (7.10.0-beta.2): locked messages stay, the cap per call is refused past 500,
  // and a deleted message's id is still a duplicate inside the window
  async purge() {
    const out = {};
    const stamp = Date.now();
    const client = new beta.ServiceBusClient(connectionString, { retryOptions });
    try {
      const sender = client.createSender("js-purge");
      const ids = [...Array(8).keys()].map((i) => `purge-${stamp}-${i}`);
      await sender.sendMessages(ids.map((id) => ({ body: id, messageId: id })));
      const receiver = client.createReceiver("js-purge");
      const locked = await receiver.receiveMessages(1, { maxWaitTimeInMs: 5000 });
      out.locked = locked.map((m) => m.body);
      out.deleted = await receiver.deleteMessages({ maxMessageCount: 3 });
      out.overCap = await refused(() => receiver.deleteMessages({ maxMessageCount: 501 }));
      // a Send-only key may not delete (batch delete needs Listen)
      const sendOnly = new beta.ServiceBusClient(process.env.ONCEBUS_SEND_ONLY, { retryOptions });
      try {
        out.sendOnlyPurge = await refused(() => sendOnly.createReceiver("js-purge").purgeMessages());
      } finally {
        await sendOnly.close();
      }
      out.purged = await receiver.purgeMessages();
      out.peeked = (await receiver.peekMessages(20)).map((m) => m.body);
      await sender.sendMessages({ body: "again", messageId: ids[5] }); // deleted: still a duplicate
      await receiver.deadLetterMessage(locked[0]);
      out.afterResend = (await receiver.peekMessages(20)).map((m) => m.body);
      const deadLetters = client.createReceiver("js-purge", { subQueueType: "deadLetter" });
      out.purgedDeadLetters = await deadLetters.purgeMessages();
      out.deadLettersLeft = (await deadLetters.peekMessages(20)).length;
      // a session receiver deletes its session's messages only
      const sessions = client.createSender("js-purge-s");
      await sessions.sendMessages(["s1", "s1", "s2"].map((sessionId, i) => ({ body: `${sessionId}-${i}`, sessionId })));
      const s1 = await client.acceptSession("js-purge-s", "s1");
      out.purgedSession = await s1.purgeMessages();
      await s1.close();
      out.sessionsLeft = (await client.acceptSession("js-purge-s", "s2").then((r) => r.peekMessages(20))).map((m) => m.body);
      out.ids = ids;
    } finally {
      await client.close();
    }
    return out;
  },

  // entity status set through the administration client and honoured at the links (com.microsoft:entity-disabled)
  async status() {
    const admin = new ServiceBusAdministrationClient(connectionString);
    const out = {};
    const setStatus = async (status) => {
      const queue = await admin.getQueue("js-status");
      queue.status = status;
      return (await admin.updateQueue(queue)).status;
    };
    await withClient(connectionString, async (client) => {
      const sender = client.createSender("js-status");
      const receive = () => client.createReceiver("js-status", { receiveMode: "receiveAndDelete" }).receiveMessages(5, { maxWaitTimeInMs: 1000 });
      out.sendDisabled = await setStatus("SendDisabled");
      out.readBack = (await admin.getQueue("js-status")).status;
      out.sendRefused = await refused(() => sender.sendMessages({ body: "no" }));
      out.receiveWhileSendDisabled = await refused(receive);
      out.receiveDisabled = await setStatus("ReceiveDisabled");
      await sender.sendMessages({ body: "kept" });
      out.receiveRefused = await refused(receive);
      out.disabled = await setStatus("Disabled");
      out.sendRefusedDisabled = await refused(() => sender.sendMessages({ body: "no" }));
      out.active = await setStatus("Active");
      out.received = (await receive()).map((m) => m.body);
    });
    out.topicReceiveDisabled = await refused(() => admin.createTopic(`js-status-t-${Date.now()}`, { status: "ReceiveDisabled" }));
    // a session-enabled queue may forward, as on Service Bus
    out.sessionForward = (
      await admin.createQueue(`js-status-s-${Date.now()}`, { requiresSession: true, forwardTo: "js-status" })
    ).forwardTo;
    return out;
  },

  // abandonMessage (rhea's modified outcome, undeliverable-here false, no delivery-failed) counts a delivery
  // attempt as on Service Bus: the count reads 1 after one abandon, and MaxDeliveryCount (10) abandons dead-letter it
  async abandon() {
    return withClient(connectionString, async (client) => {
      const body = `poison-${Date.now()}`;
      await client.createSender("js-abandon").sendMessages({ body, messageId: body });
      const receiver = client.createReceiver("js-abandon");
      const counts = [];
      for (let attempt = 0; attempt < 10; attempt++) {
        const got = await receiver.receiveMessages(1, { maxWaitTimeInMs: 5000 });
        expect(got.length === 1 && got[0].body === body, `attempt ${attempt + 1} to receive ${body}`);
        counts.push(got[0].deliveryCount);
        await receiver.abandonMessage(got[0]);
      }
      const left = await receiver.receiveMessages(1, { maxWaitTimeInMs: 2000 });
      const deadLetters = client.createReceiver("js-abandon", { subQueueType: "deadLetter", receiveMode: "receiveAndDelete" });
      const dead = await deadLetters.receiveMessages(1, { maxWaitTimeInMs: 5000 });
      return {
        counts,
        left: left.map((m) => m.body),
        deadLettered: dead.map((m) => ({ body: m.body, reason: m.deadLetterReason, deliveryCount: m.deliveryCount })),
      };
    });
  },

  // AMQP over WebSockets (webSocketOptions with the ws package): the SDK opens
  // wss://<endpoint host>:<endpoint port>/$servicebus/websocket (always TLS, even with UseDevelopmentEmulator)
  async websocket() {
    const WebSocket = require("ws");
    const id = `ws-${Date.now()}`;
    const client = new ServiceBusClient(connectionString, { retryOptions, webSocketOptions: { webSocket: WebSocket } });
    try {
      const sender = client.createSender("js-ws");
      await sender.sendMessages({ body: "first", messageId: id });
      await sender.sendMessages({ body: "again", messageId: id }); // a resend: dropped
      const batch = await sender.createMessageBatch();
      for (const body of ["second", "third"]) batch.tryAddMessage({ body, messageId: `${id}-${body}` });
      await sender.sendMessages(batch);
      await sender.sendMessages({ body: "x".repeat(200 * 1024), messageId: `${id}-big` }); // many AMQP frames
      const receiver = client.createReceiver("js-ws");
      const got = [];
      for (let i = 0; i < 5 && got.length < 4; i++) {
        const some = await receiver.receiveMessages(10, { maxWaitTimeInMs: 3000 });
        for (const message of some) await receiver.completeMessage(message);
        got.push(...some);
      }
      const left = await receiver.receiveMessages(10, { maxWaitTimeInMs: 1000 });
      const bodies = got.map((m) => (m.body.length > 100 ? `${m.body.length} bytes` : m.body)).sort();
      return { received: bodies, left: left.length };
    } finally {
      await client.close();
    }
  },

  // after a restart: what the purge deleted is still gone, and its ids are still duplicates
  async "purge-after-restart"() {
    return withClient(connectionString, async (client) => {
      const id = process.env.ONCEBUS_PURGED_ID;
      await client.createSender("js-purge").sendMessages({ body: "after-restart", messageId: id });
      const peeked = await client.createReceiver("js-purge").peekMessages(20);
      return { peeked: peeked.map((m) => m.body) };
    });
  },
};

async function main() {
  const name = process.argv[2];
  const scenario = scenarios[name];
  if (!scenario) throw new Error(`no scenario ${name}; scenarios: ${Object.keys(scenarios).join(", ")}`);
  const result = await scenario();
  process.stdout.write(JSON.stringify({ scenario: name, ok: true, result }) + "\n");
}

main().catch((error) => {
  process.stdout.write(JSON.stringify({ ok: false, error: `${error.code || error.name}: ${error.message}` }) + "\n");
  process.exit(1);
});
