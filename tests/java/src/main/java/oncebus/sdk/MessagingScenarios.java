package oncebus.sdk;

import com.azure.messaging.servicebus.ServiceBusClientBuilder;
import com.azure.messaging.servicebus.ServiceBusMessage;
import com.azure.messaging.servicebus.ServiceBusProcessorClient;
import com.azure.messaging.servicebus.ServiceBusReceivedMessage;
import com.azure.messaging.servicebus.ServiceBusReceiverClient;
import com.azure.messaging.servicebus.ServiceBusSenderClient;
import com.azure.messaging.servicebus.ServiceBusSessionReceiverClient;
import com.azure.messaging.servicebus.models.AbandonOptions;
import com.azure.messaging.servicebus.models.DeadLetterOptions;
import com.azure.messaging.servicebus.models.ServiceBusReceiveMode;
import com.azure.messaging.servicebus.models.SubQueue;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.OffsetDateTime;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/** Sessions, peek-lock settlement, scheduling, peek and the processor client, each on its own queue. */
final class MessagingScenarios {
    private static final Duration WAIT = Duration.ofSeconds(3);

    private MessagingScenarios() {
    }

    static void register(Map<String, Main.Scenario> all) {
        all.put("sessions", MessagingScenarios::sessions);
        all.put("settle", MessagingScenarios::settle);
        all.put("schedule", MessagingScenarios::schedule);
        all.put("peek", MessagingScenarios::peek);
        all.put("processor", MessagingScenarios::processor);
    }

    static ServiceBusMessage text(String body) {
        return new ServiceBusMessage(body.getBytes(StandardCharsets.UTF_8));
    }

    static String body(ServiceBusReceivedMessage message) {
        return message.getBody().toString();
    }

    static List<ServiceBusReceivedMessage> receive(ServiceBusReceiverClient receiver, int count) {
        List<ServiceBusReceivedMessage> out = new ArrayList<>();
        long deadline = System.nanoTime() + WAIT.toNanos();
        while (out.size() < count && System.nanoTime() < deadline) {
            receiver.receiveMessages(count - out.size(), WAIT).forEach(out::add);
        }
        return out;
    }

    static List<String> bodies(List<ServiceBusReceivedMessage> messages) {
        List<String> out = new ArrayList<>();
        messages.forEach(message -> out.add(body(message)));
        return out;
    }

    /** Named and next-available sessions, session state, session lock renewal. */
    private static Map<String, Object> sessions(Env env) {
        String queue = "java-sessions";
        Map<String, Object> result = new LinkedHashMap<>();
        ServiceBusClientBuilder builder = env.client();
        try (ServiceBusSenderClient sender = builder.sender().queueName(queue).buildClient();
             ServiceBusSessionReceiverClient sessions = builder.sessionReceiver().queueName(queue).buildClient()) {
            sender.sendMessages(List.of(text("a1").setSessionId("s1"), text("a2").setSessionId("s1"),
                text("b1").setSessionId("s2")));
            try (ServiceBusReceiverClient s1 = sessions.acceptSession("s1")) {
                List<ServiceBusReceivedMessage> got = receive(s1, 2);
                result.put("named", bodies(got));
                result.put("namedSessionIds", got.stream().map(ServiceBusReceivedMessage::getSessionId).toList());
                got.forEach(s1::complete);
                result.put("stateBefore", s1.getSessionState() == null ? null : "not null");
                s1.setSessionState("state-1".getBytes(StandardCharsets.UTF_8));
                result.put("state", new String(s1.getSessionState(), StandardCharsets.UTF_8));
                result.put("renewedIntoTheFuture", s1.renewSessionLock().isAfter(OffsetDateTime.now()));
            }
            try (ServiceBusReceiverClient next = sessions.acceptNextSession()) {
                result.put("nextSessionId", next.getSessionId());
                List<ServiceBusReceivedMessage> got = receive(next, 1);
                result.put("next", bodies(got));
                got.forEach(next::complete);
            }
            try (ServiceBusReceiverClient again = sessions.acceptSession("s1")) {
                result.put("stateAfterReopen", new String(again.getSessionState(), StandardCharsets.UTF_8));
                result.put("leftInS1", bodies(receive(again, 1)));
            }
        }
        return result;
    }

    /** Complete, abandon (the delivery count rises), abandon with properties, defer and dead-letter. */
    private static Map<String, Object> settle(Env env) {
        String queue = "java-settle";
        Map<String, Object> result = new LinkedHashMap<>();
        ServiceBusClientBuilder builder = env.client();
        try (ServiceBusSenderClient sender = builder.sender().queueName(queue).buildClient();
             ServiceBusReceiverClient receiver = builder.receiver().queueName(queue).buildClient()) {
            sender.sendMessage(text("complete-me"));
            ServiceBusReceivedMessage completed = receive(receiver, 1).get(0);
            receiver.complete(completed);
            result.put("completed", body(completed));

            sender.sendMessage(text("abandon-me"));
            List<Long> counts = new ArrayList<>();
            ServiceBusReceivedMessage abandoned = null;
            for (int attempt = 0; attempt < 3; attempt++) {
                abandoned = receive(receiver, 1).get(0);
                counts.add(abandoned.getDeliveryCount());
                if (attempt < 2) {
                    receiver.abandon(abandoned, new AbandonOptions()
                        .setPropertiesToModify(Map.of("attempt", attempt + 1)));
                }
            }
            result.put("abandonCounts", counts);
            result.put("modifiedProperty", abandoned.getApplicationProperties().get("attempt"));
            receiver.complete(abandoned);

            sender.sendMessage(text("defer-me"));
            ServiceBusReceivedMessage toDefer = receive(receiver, 1).get(0);
            long sequenceNumber = toDefer.getSequenceNumber();
            receiver.defer(toDefer);
            result.put("afterDefer", bodies(receive(receiver, 1)));
            ServiceBusReceivedMessage deferred = receiver.receiveDeferredMessage(sequenceNumber);
            result.put("deferred", body(deferred));
            result.put("deferredState", String.valueOf(deferred.getState()));
            receiver.complete(deferred);

            sender.sendMessage(text("dead-letter-me"));
            ServiceBusReceivedMessage toKill = receive(receiver, 1).get(0);
            receiver.deadLetter(toKill, new DeadLetterOptions().setDeadLetterReason("bad")
                .setDeadLetterErrorDescription("because"));
            try (ServiceBusReceiverClient deadLetters =
                     builder.receiver().queueName(queue).subQueue(SubQueue.DEAD_LETTER_QUEUE).buildClient()) {
                ServiceBusReceivedMessage dead = receive(deadLetters, 1).get(0);
                Map<String, Object> seen = new LinkedHashMap<>();
                seen.put("body", body(dead));
                seen.put("reason", dead.getDeadLetterReason());
                seen.put("description", dead.getDeadLetterErrorDescription());
                seen.put("state", String.valueOf(dead.getState()));
                result.put("deadLettered", seen);
                deadLetters.complete(dead);
            }
            result.put("left", bodies(receive(receiver, 1)));
        }
        return result;
    }

    /** Schedule one far ahead and cancel it; schedule one a second ahead and receive it when due. */
    private static Map<String, Object> schedule(Env env) {
        String queue = "java-sched";
        Map<String, Object> result = new LinkedHashMap<>();
        ServiceBusClientBuilder builder = env.client();
        try (ServiceBusSenderClient sender = builder.sender().queueName(queue).buildClient();
             ServiceBusReceiverClient receiver = builder.receiver().queueName(queue).buildClient()) {
            OffsetDateTime later = OffsetDateTime.now().plusHours(1).withNano(0);
            long cancelled = sender.scheduleMessage(text("cancel-me"), later);
            ServiceBusReceivedMessage peeked = receiver.peekMessage(cancelled);
            result.put("peekedState", String.valueOf(peeked.getState()));
            result.put("peekedAtScheduledTime", later.isEqual(peeked.getScheduledEnqueueTime()));
            List<Long> pair = new ArrayList<>();
            sender.scheduleMessages(List.of(text("pair-1"), text("pair-2")), later).forEach(pair::add);
            result.put("pairSequenceNumbers", pair.size());
            sender.cancelScheduledMessage(cancelled);
            sender.cancelScheduledMessages(pair);
            result.put("peekAfterCancel", bodies(toList(receiver.peekMessages(10, cancelled))));

            OffsetDateTime soon = OffsetDateTime.now().plusSeconds(1);
            sender.scheduleMessage(text("due-soon"), soon);
            result.put("beforeDue", bodies(toList(receiver.receiveMessages(1, Duration.ofMillis(200)))));
            List<ServiceBusReceivedMessage> due = new ArrayList<>();
            long deadline = System.nanoTime() + Duration.ofSeconds(10).toNanos();
            while (due.isEmpty() && System.nanoTime() < deadline) {
                receiver.receiveMessages(1, Duration.ofSeconds(2)).forEach(due::add);
            }
            result.put("due", bodies(due));
            if (!due.isEmpty()) {
                result.put("enqueuedNotBeforeSchedule", !due.get(0).getEnqueuedTime().isBefore(soon.withNano(0)));
                receiver.complete(due.get(0));
            }
        }
        return result;
    }

    private static List<ServiceBusReceivedMessage> toList(Iterable<ServiceBusReceivedMessage> messages) {
        List<ServiceBusReceivedMessage> out = new ArrayList<>();
        messages.forEach(out::add);
        return out;
    }

    /**
     * Peek continues from the last message peeked (the SDK keeps that number); a peek from a sequence number does not
     * move it; a peek locks nothing.
     */
    private static Map<String, Object> peek(Env env) {
        String queue = "java-peek";
        Map<String, Object> result = new LinkedHashMap<>();
        ServiceBusClientBuilder builder = env.client();
        try (ServiceBusSenderClient sender = builder.sender().queueName(queue).buildClient();
             ServiceBusReceiverClient receiver = builder.receiver().queueName(queue).buildClient()) {
            sender.sendMessages(List.of(text("p1"), text("p2"), text("p3"), text("p4")));
            ServiceBusReceivedMessage first = receiver.peekMessage();
            result.put("first", body(first));
            result.put("second", body(receiver.peekMessage()));
            result.put("fromFourth", body(receiver.peekMessage(first.getSequenceNumber() + 3)));
            result.put("rest", bodies(toList(receiver.peekMessages(10))));  // from after the second
            result.put("afterAll", receiver.peekMessage() == null ? null : "a message");
            List<ServiceBusReceivedMessage> received = receive(receiver, 4);
            result.put("received", bodies(received));
            result.put("deliveryCounts", received.stream().map(ServiceBusReceivedMessage::getDeliveryCount).toList());
            received.forEach(receiver::complete);
            result.put("peekFromStartWhenEmpty", bodies(toList(receiver.peekMessages(10, 1))));
        }
        return result;
    }

    /** ServiceBusProcessorClient: five messages, one handler failure (abandoned, redelivered), auto-complete. */
    private static Map<String, Object> processor(Env env) throws Exception {
        String queue = "java-processor";
        Map<String, Object> result = new LinkedHashMap<>();
        ServiceBusClientBuilder builder = env.client();
        List<String> handled = Collections.synchronizedList(new ArrayList<>());
        List<Long> failingCounts = Collections.synchronizedList(new ArrayList<>());
        List<String> errors = Collections.synchronizedList(new ArrayList<>());
        AtomicInteger failures = new AtomicInteger();
        CountDownLatch done = new CountDownLatch(5);
        try (ServiceBusSenderClient sender = builder.sender().queueName(queue).buildClient()) {
            sender.sendMessages(List.of(text("m1"), text("m2"), text("fail-once"), text("m4"), text("m5")));
        }
        ServiceBusProcessorClient processor = builder.processor().queueName(queue).maxConcurrentCalls(1)
            .processMessage(context -> {
                ServiceBusReceivedMessage message = context.getMessage();
                if (body(message).equals("fail-once")) {
                    failingCounts.add(message.getDeliveryCount());
                    if (failures.getAndIncrement() == 0) {
                        throw new IllegalStateException("the handler fails once");
                    }
                }
                handled.add(body(message));
                done.countDown();
            })
            .processError(context -> errors.add(context.getException().getClass().getSimpleName() + ": "
                + context.getException().getMessage()))
            .buildProcessorClient();
        processor.start();
        boolean all = done.await(30, TimeUnit.SECONDS);
        List<String> left;
        try (ServiceBusReceiverClient receiver = builder.receiver().queueName(queue).buildClient()) {
            // the processor completes a message after its handler returns: wait for the last completion
            long deadline = System.nanoTime() + Duration.ofSeconds(10).toNanos();
            do {
                left = bodies(toList(receiver.peekMessages(10, 1)));
            } while (!left.isEmpty() && System.nanoTime() < deadline);
        }
        processor.close();
        result.put("allHandled", all);
        List<String> sorted = new ArrayList<>(handled);
        Collections.sort(sorted);
        result.put("handled", sorted);
        result.put("failingDeliveryCounts", failingCounts);
        result.put("errors", errors);
        result.put("left", left);
        return result;
    }
}
