// The shared duplicate-detection scenarios (tests/data/scenarios.json), the same list every layer's tests answer
// (the Python, Java and Go SDKs' too). The broker reads its time from ONCEBUS_CLOCK_FILE, which this writes before
// each step, so the steps happen at their exact offsets; a restart step asks the Python test for one (a line
// {"restart": true} on stdout) and reads the restarted server's connection string from stdin.
"use strict";

const fs = require("fs");
const readline = require("readline");
const { ServiceBusClient, ServiceBusAdministrationClient } = require("@azure/service-bus");

const retryOptions = { maxRetries: 0, timeoutInMs: 15000 };

function loadScenario(name) {
  const file = JSON.parse(fs.readFileSync(process.env.ONCEBUS_SCENARIO_FILE, "utf8"));
  const found = file.scenarios.find((s) => s.name === name);
  if (!found) throw new Error(`no scenario ${name} in ${process.env.ONCEBUS_SCENARIO_FILE}`);
  return found;
}

// the file the broker reads its time from: integer microseconds since the epoch
const clock = {
  path: process.env.ONCEBUS_CLOCK_FILE,
  now() {
    return BigInt(fs.readFileSync(this.path, "utf8").trim());
  },
  set(us) {
    const temporary = `${this.path}.js.tmp`;
    fs.writeFileSync(temporary, us.toString());
    fs.renameSync(temporary, this.path);
  },
};

function sdkMessage(fields) {
  const message = { body: "body", messageId: fields.message_id };
  if (fields.session_id != null) message.sessionId = fields.session_id;
  if (fields.partition_key != null) message.partitionKey = fields.partition_key;
  return message;
}

// the driver's answers (read only by a scenario that restarts: another never holds stdin open)
let lines = null;
let iterator = null;
async function readLine() {
  if (lines === null) {
    lines = readline.createInterface({ input: process.stdin });
    iterator = lines[Symbol.asyncIterator]();
  }
  const answer = await iterator.next();
  if (answer.done) throw new Error("no connection string after the restart");
  return answer.value;
}

async function runDedupScenario(name) {
  const scenario = loadScenario(name);
  const queue = scenario.name.replace(/_/g, "-");
  let connectionString = process.env.ONCEBUS_CONNECTION_STRING;
  let client = new ServiceBusClient(connectionString, { retryOptions });
  let sender = client.createSender(queue);
  const startUs = clock.now() + 1000000n;
  const delivered = [];
  const refused = [];

  async function receiveAll(receiveMode) {
    const receiver = client.createReceiver(queue, { receiveMode });
    const out = [];
    try {
      for (;;) {
        const got = await receiver.receiveMessages(20, { maxWaitTimeInMs: 1000 });
        if (got.length === 0) return out;
        for (const message of got) {
          if (receiveMode === "peekLock") await receiver.completeMessage(message);
          out.push([message.messageId, message.partitionKey ?? message.sessionId ?? null]);
        }
      }
    } finally {
      await receiver.close();
    }
  }

  try {
    for (const step of scenario.steps) {
      const atUs = startUs + BigInt(Math.round(step.at * 1000000));
      clock.set(atUs);
      let send = null;
      if (step.restart) {
        await client.close();
        process.stdout.write(JSON.stringify({ restart: true }) + "\n");
        connectionString = (await readLine()).trim();
        client = new ServiceBusClient(connectionString, { retryOptions });
        sender = client.createSender(queue);
        continue;
      } else if (step.set_window) {
        const admin = new ServiceBusAdministrationClient(connectionString);
        const properties = await admin.getQueue(queue);
        properties.duplicateDetectionHistoryTimeWindow = step.set_window;
        await admin.updateQueue(properties);
        continue;
      } else if (step.receive_complete) {
        delivered.push(...(await receiveAll("peekLock")));
        continue;
      } else if (step.advance) {
        continue;
      } else if (step.send) {
        send = () => sender.sendMessages(sdkMessage(step.send));
      } else if (step.batch) {
        send = async () => {
          const batch = await sender.createMessageBatch();
          for (const fields of step.batch) {
            if (!batch.tryAddMessage(sdkMessage(fields))) throw new Error("the batch is full");
          }
          await sender.sendMessages(batch);
        };
      } else if (step.schedule) {
        const when = new Date(Number(atUs / 1000n) + step.enqueue_after * 1000);
        send = () => sender.scheduleMessages(sdkMessage(step.schedule), when);
      }
      let error = null;
      try {
        await send();
      } catch (caught) {
        error = `${caught.code || caught.name}: ${caught.message}`;
      }
      if (step.error) {
        if (error === null) throw new Error(`step at ${step.at}: the send was accepted; it must fail`);
        refused.push(error);
      } else if (error !== null) {
        throw new Error(`step at ${step.at}: ${error}`);
      }
    }
    delivered.push(...(await receiveAll("receiveAndDelete")));
  } finally {
    await client.close();
    if (lines !== null) lines.close();
  }
  return { delivered, refused };
}

module.exports = { runDedupScenario };
