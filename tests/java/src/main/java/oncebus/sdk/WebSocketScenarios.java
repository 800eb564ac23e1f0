package oncebus.sdk;

import com.azure.core.amqp.AmqpTransportType;
import com.azure.messaging.servicebus.ServiceBusClientBuilder;
import com.azure.messaging.servicebus.ServiceBusMessage;
import com.azure.messaging.servicebus.ServiceBusMessageBatch;
import com.azure.messaging.servicebus.ServiceBusReceivedMessage;
import com.azure.messaging.servicebus.ServiceBusReceiverClient;
import com.azure.messaging.servicebus.ServiceBusSenderClient;
import com.azure.messaging.servicebus.ServiceBusSessionReceiverClient;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * AMQP over WebSockets ({@code transportType(AmqpTransportType.AMQP_WEB_SOCKETS)}): proton-j's WebSocket layer
 * upgrades {@code GET https://<host>/$servicebus/websocket} (the absolute form; subprotocol {@code AMQPWSB10}) on the
 * endpoint's host and port, or {@code customEndpointAddress}'s. Always over TLS, also with
 * {@code UseDevelopmentEmulator=true} (which then only skips verifying the server's certificate): oncebus's main
 * port and TLS port take it, its HTTP port (plain HTTP only) does not.
 */
final class WebSocketScenarios {
    private WebSocketScenarios() {
    }

    static void register(Map<String, Main.Scenario> all) {
        all.put("websocket", WebSocketScenarios::emulatorString);
        all.put("websocket-tls", WebSocketScenarios::tlsCustomEndpoint);
    }

    /** The printed (emulator) connection string: ws:// to the endpoint's own port. */
    private static Map<String, Object> emulatorString(Env env) {
        ServiceBusClientBuilder builder = Env.client(env.connectionString).transportType(
            AmqpTransportType.AMQP_WEB_SOCKETS);
        return roundTrip(builder, "java-ws", "java-ws-sessions");
    }

    /**
     * A connection string as Azure gives it (no port, no emulator flag; the host swapped): the SDK would open
     * wss:// on port 443, so {@code customEndpointAddress} names the port; TLS trusted through the JVM's
     * truststore ({@code -Djavax.net.ssl.trustStore}).
     */
    private static Map<String, Object> tlsCustomEndpoint(Env env) {
        String azureStyle = env.connectionString.replace(";UseDevelopmentEmulator=true", "")
            .replace("sb://127.0.0.1:" + Env.port(env.connectionString), "sb://127.0.0.1");
        ServiceBusClientBuilder builder = Env.client(azureStyle)
            .transportType(AmqpTransportType.AMQP_WEB_SOCKETS)
            .customEndpointAddress("https://127.0.0.1:" + env.tlsPort);
        Map<String, Object> result = roundTrip(builder, "java-wss", "java-wss-sessions");
        result.put("connectionString", azureStyle.replaceAll("SharedAccessKey=[^;]*", "SharedAccessKey=..."));
        return result;
    }

    /**
     * Send, a duplicate resend (dropped), a batch, a 200 KiB message (proton-j's WebSocket layer writes frames of
     * at most 4 KiB: one transfer in many frames); received and completed. A session accepted by name, with state.
     */
    private static Map<String, Object> roundTrip(ServiceBusClientBuilder builder, String queue, String sessionQueue) {
        Map<String, Object> result = new LinkedHashMap<>();
        byte[] large = new byte[200 * 1024];
        java.util.Arrays.fill(large, (byte) 'x');
        try (ServiceBusSenderClient sender = builder.sender().queueName(queue).buildClient();
             ServiceBusReceiverClient receiver = builder.receiver().queueName(queue).buildClient()) {
            sender.sendMessage(MessagingScenarios.text("first").setMessageId("ws-1"));
            sender.sendMessage(MessagingScenarios.text("first, resent").setMessageId("ws-1"));
            ServiceBusMessageBatch batch = sender.createMessageBatch();
            batch.tryAddMessage(MessagingScenarios.text("second").setMessageId("ws-2"));
            batch.tryAddMessage(MessagingScenarios.text("third").setMessageId("ws-3"));
            sender.sendMessages(batch);
            sender.sendMessage(new ServiceBusMessage(large).setMessageId("ws-large"));
            List<ServiceBusReceivedMessage> got = MessagingScenarios.receive(receiver, 4);
            List<String> received = new ArrayList<>();
            for (ServiceBusReceivedMessage message : got) {
                byte[] body = message.getBody().toBytes();
                received.add(body.length > 100 ? body.length + " bytes" : new String(body, StandardCharsets.UTF_8));
                receiver.complete(message);
            }
            Collections.sort(received);
            result.put("received", received);
            result.put("left", MessagingScenarios.bodies(MessagingScenarios.receive(receiver, 1)));
        }
        try (ServiceBusSenderClient sender = builder.sender().queueName(sessionQueue).buildClient();
             ServiceBusSessionReceiverClient sessions = builder.sessionReceiver().queueName(sessionQueue)
                 .buildClient()) {
            sender.sendMessages(List.of(MessagingScenarios.text("a1").setSessionId("ws-s"),
                MessagingScenarios.text("a2").setSessionId("ws-s")));
            try (ServiceBusReceiverClient session = sessions.acceptSession("ws-s")) {
                List<ServiceBusReceivedMessage> got = MessagingScenarios.receive(session, 2);
                got.forEach(session::complete);
                result.put("session", MessagingScenarios.bodies(got));
                result.put("sessionIds", got.stream().map(ServiceBusReceivedMessage::getSessionId).toList());
                session.setSessionState("ws-state".getBytes(StandardCharsets.UTF_8));
                result.put("state", new String(session.getSessionState(), StandardCharsets.UTF_8));
            }
        }
        return result;
    }
}
