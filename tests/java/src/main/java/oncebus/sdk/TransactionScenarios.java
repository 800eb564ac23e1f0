package oncebus.sdk;

import static oncebus.sdk.MessagingScenarios.bodies;
import static oncebus.sdk.MessagingScenarios.receive;
import static oncebus.sdk.MessagingScenarios.text;

import com.azure.messaging.servicebus.ServiceBusClientBuilder;
import com.azure.messaging.servicebus.ServiceBusReceivedMessage;
import com.azure.messaging.servicebus.ServiceBusReceiverClient;
import com.azure.messaging.servicebus.ServiceBusSenderClient;
import com.azure.messaging.servicebus.ServiceBusTransactionContext;
import com.azure.messaging.servicebus.models.CompleteOptions;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** ServiceBusTransactionContext: a send and a completion in one transaction, committed or rolled back. */
final class TransactionScenarios {
    private TransactionScenarios() {
    }

    static void register(Map<String, Main.Scenario> all) {
        all.put("transaction-commit", TransactionScenarios::commit);
        all.put("transaction-rollback", TransactionScenarios::rollback);
        all.put("transaction-cross-entity", TransactionScenarios::crossEntity);
        all.put("transaction-refused-send", TransactionScenarios::refusedSend);
        all.put("transaction-cross-entity-crash", TransactionScenarios::crossEntityCrash);
    }

    private static List<String> peekBodies(ServiceBusReceiverClient receiver) {
        List<ServiceBusReceivedMessage> out = new ArrayList<>();
        receiver.peekMessages(10, 1).forEach(out::add);
        return bodies(out);
    }

    /** Receive "in"; in one transaction send "out" and complete "in"; nothing shows before the commit. */
    private static Map<String, Object> commit(Env env) {
        String queue = "java-txn-commit";
        Map<String, Object> result = new LinkedHashMap<>();
        ServiceBusClientBuilder builder = env.client();
        try (ServiceBusSenderClient sender = builder.sender().queueName(queue).buildClient();
             ServiceBusReceiverClient receiver = builder.receiver().queueName(queue).buildClient()) {
            sender.sendMessage(text("in").setMessageId("in"));
            ServiceBusReceivedMessage in = receive(receiver, 1).get(0);
            ServiceBusTransactionContext transaction = sender.createTransaction();
            result.put("transactionIdLength", transaction.getTransactionId().remaining());
            sender.sendMessage(text("out").setMessageId("out"), transaction);
            receiver.complete(in, new CompleteOptions().setTransactionContext(transaction));
            result.put("peekBeforeCommit", peekBodies(receiver));
            sender.commitTransaction(transaction);
            result.put("peekAfterCommit", peekBodies(receiver));
            sender.sendMessage(text("out again").setMessageId("out"));  // a duplicate of the committed send
            List<ServiceBusReceivedMessage> after = receive(receiver, 2);
            result.put("receivedAfterCommit", bodies(after));
            after.forEach(receiver::complete);
        }
        return result;
    }

    /** The same, rolled back: "keep" stays (locked until abandoned), "never" is not stored nor its id held. */
    private static Map<String, Object> rollback(Env env) {
        String queue = "java-txn-rollback";
        Map<String, Object> result = new LinkedHashMap<>();
        ServiceBusClientBuilder builder = env.client();
        try (ServiceBusSenderClient sender = builder.sender().queueName(queue).buildClient();
             ServiceBusReceiverClient receiver = builder.receiver().queueName(queue).buildClient()) {
            sender.sendMessage(text("keep").setMessageId("keep"));
            ServiceBusReceivedMessage keep = receive(receiver, 1).get(0);
            ServiceBusTransactionContext transaction = receiver.createTransaction();
            sender.sendMessage(text("never").setMessageId("never"), transaction);
            receiver.complete(keep, new CompleteOptions().setTransactionContext(transaction));
            receiver.rollbackTransaction(transaction);
            result.put("peekAfterRollback", peekBodies(receiver));
            try {
                receiver.abandon(keep);
                result.put("abandonAfterRollback", "accepted");
            } catch (IllegalArgumentException e) {
                result.put("abandonAfterRollback", Main.describe(e));
            }
            sender.sendMessage(text("never, sent again").setMessageId("never"));  // new: the rollback kept no key
            // "keep" stays locked by this receiver until its lock (5 s) expires, then comes again
            List<ServiceBusReceivedMessage> after = new ArrayList<>();
            long deadline = System.nanoTime() + java.time.Duration.ofSeconds(20).toNanos();
            while (after.size() < 2 && System.nanoTime() < deadline) {
                receiver.receiveMessages(2 - after.size(), java.time.Duration.ofSeconds(2)).forEach(after::add);
            }
            result.put("receivedAfterRollback", bodies(after));
            result.put("deliveryCounts", after.stream().map(ServiceBusReceivedMessage::getDeliveryCount).toList());
            after.forEach(receiver::complete);
        }
        return result;
    }

    /**
     * enableCrossEntityTransactions: every link of the client on one AMQP session opened after a coordinator; the
     * first entity used (java-txn-a) becomes the send-via entity. Receive from it, send to java-txn-b, complete, commit;
     * then the same rolled back. A receiver on java-txn-b from that client is refused, as Service Bus refuses it ("a
     * receive cannot be routed through another entity"); java-txn-b is read with a client of its own.
     */
    private static Map<String, Object> crossEntity(Env env) {
        String source = "java-txn-a";
        String destination = "java-txn-b";
        Map<String, Object> result = new LinkedHashMap<>();
        ServiceBusClientBuilder builder = env.client().enableCrossEntityTransactions();
        ServiceBusClientBuilder plain = env.client();
        try (ServiceBusSenderClient toSource = builder.sender().queueName(source).buildClient();
             ServiceBusReceiverClient fromSource = builder.receiver().queueName(source).buildClient();
             ServiceBusSenderClient toDestination = builder.sender().queueName(destination).buildClient();
             ServiceBusReceiverClient fromDestination = plain.receiver().queueName(destination).buildClient()) {
            toSource.sendMessage(text("order").setMessageId("order"));
            ServiceBusReceivedMessage order = receive(fromSource, 1).get(0);
            ServiceBusTransactionContext transaction = fromSource.createTransaction();
            fromSource.complete(order, new CompleteOptions().setTransactionContext(transaction));
            result.put("transactionalSend", send(toDestination, "shipped", transaction));
            result.put("destinationBeforeCommit", peekBodies(fromDestination));
            fromSource.commitTransaction(transaction);
            result.put("sourceAfterCommit", peekBodies(fromSource));
            List<ServiceBusReceivedMessage> shipped = receive(fromDestination, 1);
            result.put("destinationAfterCommit", bodies(shipped));
            shipped.forEach(fromDestination::complete);

            toSource.sendMessage(text("second order").setMessageId("second order"));
            ServiceBusReceivedMessage second = receive(fromSource, 1).get(0);
            ServiceBusTransactionContext rolledBack = toSource.createTransaction();
            fromSource.complete(second, new CompleteOptions().setTransactionContext(rolledBack));
            result.put("rolledBackSend", send(toDestination, "never shipped", rolledBack));
            toSource.rollbackTransaction(rolledBack);
            result.put("destinationAfterRollback", peekBodies(fromDestination));
            result.put("sourceAfterRollback", peekBodies(fromSource));  // locked until its lock expires

            toDestination.sendMessage(text("plain").setMessageId("plain"));  // outside a transaction: at once
            try (ServiceBusReceiverClient crossEntityReceiver =
                     builder.receiver().queueName(destination).buildClient()) {
                List<String> got = new ArrayList<>();
                crossEntityReceiver.receiveMessages(1, java.time.Duration.ofSeconds(3))
                    .forEach(m -> got.add(m.getBody().toString()));
                result.put("receiverOnDestination", got);
            } catch (RuntimeException e) {
                result.put("receiverOnDestination", Main.describe(e));
            }
            List<ServiceBusReceivedMessage> plainSent = receive(fromDestination, 1);
            result.put("plainSend", bodies(plainSent));
            plainSent.forEach(fromDestination::complete);
        }
        return result;
    }

    /**
     * A cross-entity transaction (complete in java-crash-a, send to java-crash-b) and the clocked server killed
     * before the commit: after its restart nothing of the transaction is there ("order" is back in java-crash-a).
     */
    private static Map<String, Object> crossEntityCrash(Env env) throws Exception {
        String source = "java-crash-a";
        String destination = "java-crash-b";
        Map<String, Object> result = new LinkedHashMap<>();
        ServiceBusClientBuilder builder = Env.client(env.clockedConnectionString).enableCrossEntityTransactions();
        ServiceBusSenderClient toSource = builder.sender().queueName(source).buildClient();
        ServiceBusReceiverClient fromSource = builder.receiver().queueName(source).buildClient();
        ServiceBusSenderClient toDestination = builder.sender().queueName(destination).buildClient();
        toSource.sendMessage(text("order").setMessageId("order"));
        ServiceBusReceivedMessage order = receive(fromSource, 1).get(0);
        ServiceBusTransactionContext transaction = fromSource.createTransaction();
        fromSource.complete(order, new CompleteOptions().setTransactionContext(transaction));
        result.put("transactionalSend", send(toDestination, "shipped", transaction));
        env.clockedConnectionString = Main.requestCrash();
        for (AutoCloseable client : List.<AutoCloseable>of(toDestination, fromSource, toSource)) {
            try {
                client.close();
            } catch (Exception e) {
                // the server it spoke to is gone
            }
        }
        ServiceBusClientBuilder after = Env.client(env.clockedConnectionString);
        try (ServiceBusReceiverClient fromDestination = after.receiver().queueName(destination).buildClient();
             ServiceBusReceiverClient fromSourceAgain = after.receiver().queueName(source).buildClient()) {
            List<ServiceBusReceivedMessage> shipped = receive(fromDestination, 1);
            result.put("destinationAfterCrash", bodies(shipped));
            List<ServiceBusReceivedMessage> orders = receive(fromSourceAgain, 1);
            result.put("sourceAfterCrash", bodies(orders));
            orders.forEach(fromSourceAgain::complete);
        }
        return result;
    }

    private static Object send(ServiceBusSenderClient sender, String body, ServiceBusTransactionContext transaction) {
        try {
            sender.sendMessage(text(body), transaction);
            return "returned";
        } catch (RuntimeException e) {
            return Main.describe(e);
        }
    }

    /**
     * A transactional send the broker refuses (another entity than the transaction's, without send-via): the SDK's
     * sendMessage returns as if it were sent, the commit succeeds, and the message is nowhere.
     */
    private static Map<String, Object> refusedSend(Env env) {
        String settled = "java-txn-c";
        String other = "java-txn-d";
        Map<String, Object> result = new LinkedHashMap<>();
        ServiceBusClientBuilder builder = env.client();
        try (ServiceBusSenderClient toSettled = builder.sender().queueName(settled).buildClient();
             ServiceBusReceiverClient fromSettled = builder.receiver().queueName(settled).buildClient();
             ServiceBusSenderClient toOther = builder.sender().queueName(other).buildClient();
             ServiceBusReceiverClient fromOther = builder.receiver().queueName(other).buildClient()) {
            toSettled.sendMessage(text("work"));
            ServiceBusReceivedMessage work = receive(fromSettled, 1).get(0);
            ServiceBusTransactionContext transaction = toSettled.createTransaction();
            fromSettled.complete(work, new CompleteOptions().setTransactionContext(transaction));
            result.put("transactionalSend", send(toOther, "lost", transaction));
            toSettled.commitTransaction(transaction);
            result.put("committed", true);
            result.put("settledAfterCommit", peekBodies(fromSettled));
            result.put("otherAfterCommit", peekBodies(fromOther));
        }
        return result;
    }
}
