// A created namespace with the official JavaScript SDK (@azure/service-bus 7.9.5, from tests/js), reached with
// nothing but its connection string (SharedAccessKeyName=<key>@<namespace>): run by test_js_namespace.py with
// ONCEBUS_CONNECTION_STRING and the queue name in argv. Sends m1, m2 and m1 again (the queue detects duplicates),
// receives what is there and prints one JSON line.
"use strict";

const { ServiceBusClient } = require("@azure/service-bus");

async function main() {
  const client = new ServiceBusClient(process.env.ONCEBUS_CONNECTION_STRING);
  const queue = process.argv[2];
  try {
    const sender = client.createSender(queue);
    for (const id of ["m1", "m2", "m1"]) {
      await sender.sendMessages({ body: `js:${id}`, messageId: id });
    }
    await sender.close();
    const receiver = client.createReceiver(queue, { receiveMode: "receiveAndDelete" });
    const bodies = [];
    for (let i = 0; i < 5 && bodies.length < 3; i++) {
      const batch = await receiver.receiveMessages(3 - bodies.length, { maxWaitTimeInMs: 1000 });
      if (batch.length === 0) break;
      bodies.push(...batch.map((m) => m.body));
    }
    await receiver.close();
    console.log(JSON.stringify({ received: bodies.sort() }));
  } finally {
    await client.close();
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
