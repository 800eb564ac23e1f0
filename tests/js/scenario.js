// One scenario of the official JavaScript SDK (@azure/service-bus) against `oncebus serve`.
// Usage: node scenario.js <name>; run by tests/js/test_js_sdk.py, which starts the server and sets:
//   ONCEBUS_CONNECTION_STRING  the connection string `oncebus serve` printed (a key with all rights)
//   ONCEBUS_SEND_ONLY, ONCEBUS_LISTEN_ONLY  connection strings with a Send-only and a Listen-only key
//   NODE_EXTRA_CA_CERTS  the server's CA file (the admin client speaks HTTPS)
// Prints one JSON line with what it saw; exits 1 (with the error) when something the scenario expects fails.
"use strict";

const { ServiceBusClient, ServiceBusAdministrationClient } = require("@azure/service-bus");

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
