package oncebus.sdk;

import com.azure.messaging.servicebus.ServiceBusClientBuilder;
import com.azure.messaging.servicebus.ServiceBusMessage;
import com.azure.messaging.servicebus.ServiceBusMessageBatch;
import com.azure.messaging.servicebus.ServiceBusReceivedMessage;
import com.azure.messaging.servicebus.ServiceBusReceiverClient;
import com.azure.messaging.servicebus.ServiceBusSenderClient;
import com.azure.messaging.servicebus.administration.ServiceBusAdministrationClient;
import com.azure.messaging.servicebus.administration.models.QueueProperties;
import com.azure.messaging.servicebus.models.ServiceBusReceiveMode;
import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.time.Duration;
import java.time.Instant;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The shared duplicate-detection scenarios (tests/data/scenarios.json), one scenario named {@code dedup:<name>}
 * each, on the clocked server: every step happens at its exact offset on the broker's clock, which this program
 * sets by writing the clock file. A scenario's queue is its name with dashes (the driver's topology creates it).
 */
final class DedupScenarios {
    private DedupScenarios() {
    }

    static void register(Map<String, Main.Scenario> all) throws IOException {
        String file = System.getenv("ONCEBUS_SCENARIO_FILE");
        if (file == null || file.isBlank()) {
            return;
        }
        for (JsonNode scenario : Main.JSON.readTree(Path.of(file).toFile()).get("scenarios")) {
            all.put("dedup:" + scenario.get("name").asText(), env -> run(env, scenario));
        }
    }

    /** Returns {@code delivered}: [message_id, partition key or session id or null] per delivery, in order. */
    private static Map<String, Object> run(Env env, JsonNode scenario) throws Exception {
        String queue = scenario.get("name").asText().replace('_', '-');
        BrokerClock clock = new BrokerClock(env.clockFile);
        long startUs = clock.nowUs + 1_000_000;
        List<List<Object>> delivered = new ArrayList<>();
        List<Map<String, Object>> refusals = new ArrayList<>();
        ServiceBusClientBuilder builder = Env.client(env.clockedConnectionString);
        ServiceBusSenderClient sender = builder.sender().queueName(queue).buildClient();
        try {
            for (JsonNode step : scenario.get("steps")) {
                long atUs = startUs + Math.round(step.get("at").asDouble() * 1_000_000);
                clock.set(atUs);
                if (step.has("restart")) {
                    sender.close();
                    env.clockedConnectionString = Main.requestRestart();
                    builder = Env.client(env.clockedConnectionString);
                    sender = builder.sender().queueName(queue).buildClient();
                } else if (step.has("set_window")) {
                    ServiceBusAdministrationClient admin = Env.admin(env.clockedConnectionString);
                    QueueProperties properties = admin.getQueue(queue);
                    properties.setDuplicateDetectionHistoryTimeWindow(Duration.parse(step.get("set_window").asText()));
                    admin.updateQueue(properties);
                } else if (step.has("receive_complete")) {
                    delivered.addAll(receive(builder, queue, true));
                } else if (step.has("advance")) {
                    continue;
                } else if (step.path("error").asBoolean(false)) {
                    try {
                        send(sender, step, atUs);
                        refusals.add(Map.of("refused", false));
                    } catch (RuntimeException e) {
                        Map<String, Object> refusal = new LinkedHashMap<>(Main.describe(e));
                        refusal.put("refused", true);
                        refusals.add(refusal);
                    }
                } else {
                    send(sender, step, atUs);
                }
            }
            delivered.addAll(receive(builder, queue, false));
        } finally {
            sender.close();
        }
        Map<String, Object> result = new LinkedHashMap<>();
        result.put("delivered", delivered);
        result.put("refusals", refusals);
        return result;
    }

    private static void send(ServiceBusSenderClient sender, JsonNode step, long atUs) {
        if (step.has("send")) {
            sender.sendMessage(message(step.get("send")));
        } else if (step.has("batch")) {
            ServiceBusMessageBatch batch = sender.createMessageBatch();
            for (JsonNode fields : step.get("batch")) {
                if (!batch.tryAddMessage(message(fields))) {
                    throw new IllegalStateException("the batch is full");
                }
            }
            sender.sendMessages(batch);
        } else {
            long enqueueUs = atUs + Math.round(step.get("enqueue_after").asDouble() * 1_000_000);
            sender.scheduleMessage(message(step.get("schedule")), fromMicros(enqueueUs));
        }
    }

    private static ServiceBusMessage message(JsonNode fields) {
        ServiceBusMessage message = new ServiceBusMessage("body".getBytes(java.nio.charset.StandardCharsets.UTF_8));
        message.setMessageId(fields.get("message_id").asText());
        String sessionId = fields.hasNonNull("session_id") ? fields.get("session_id").asText() : null;
        String partitionKey = fields.hasNonNull("partition_key") ? fields.get("partition_key").asText() : null;
        if (sessionId != null && partitionKey != null && !sessionId.equals(partitionKey)) {
            // the SDK refuses to build this (setPartitionKey throws); another client may still send it
            message.getRawAmqpMessage().getProperties().setGroupId(sessionId);
            message.getRawAmqpMessage().getMessageAnnotations().put("x-opt-partition-key", partitionKey);
            return message;
        }
        if (sessionId != null) {
            message.setSessionId(sessionId);
        }
        if (partitionKey != null) {
            message.setPartitionKey(partitionKey);
        }
        return message;
    }

    private static List<List<Object>> receive(ServiceBusClientBuilder builder, String queue, boolean complete) {
        List<List<Object>> out = new ArrayList<>();
        ServiceBusReceiveMode mode = complete ? ServiceBusReceiveMode.PEEK_LOCK : ServiceBusReceiveMode.RECEIVE_AND_DELETE;
        try (ServiceBusReceiverClient receiver = builder.receiver().queueName(queue).receiveMode(mode).buildClient()) {
            while (true) {
                int before = out.size();
                for (ServiceBusReceivedMessage message : receiver.receiveMessages(20, Duration.ofSeconds(1))) {
                    String key = message.getPartitionKey() != null ? message.getPartitionKey() : message.getSessionId();
                    out.add(Arrays.asList(message.getMessageId(), key));
                    if (complete) {
                        receiver.complete(message);
                    }
                }
                if (out.size() == before) {
                    return out;
                }
            }
        }
    }

    static OffsetDateTime fromMicros(long us) {
        return Instant.EPOCH.plus(us, ChronoUnit.MICROS).atOffset(ZoneOffset.UTC);
    }

    /** The broker's clock: integer microseconds since the epoch in a file the server reads; it only moves forward. */
    static final class BrokerClock {
        private final Path file;
        long nowUs;

        BrokerClock(Path file) throws IOException {
            if (file == null) {
                throw new IllegalStateException("ONCEBUS_CLOCK_FILE is not set");
            }
            this.file = file;
            this.nowUs = Long.parseLong(Files.readString(file).trim());
        }

        void set(long us) throws IOException {
            if (us < nowUs) {
                throw new IllegalStateException("the broker's clock only moves forward");
            }
            nowUs = us;
            Path temporary = file.resolveSibling(file.getFileName() + ".java.tmp");
            Files.writeString(temporary, Long.toString(us));
            Files.move(temporary, file, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
        }
    }
}
