package oncebus.sdk;

import com.azure.core.amqp.AmqpRetryOptions;
import com.azure.core.http.policy.HttpPipelinePolicy;
import com.azure.core.util.UrlBuilder;
import com.azure.messaging.servicebus.ServiceBusClientBuilder;
import com.azure.messaging.servicebus.administration.ServiceBusAdministrationClient;
import com.azure.messaging.servicebus.administration.ServiceBusAdministrationClientBuilder;
import java.net.URI;
import java.nio.file.Path;
import java.time.Duration;

/**
 * The servers under test, from the environment the driver sets.
 *
 * <ul>
 *   <li>{@code ONCEBUS_CONNECTION_STRING}: a server on the real clock (messaging, transactions, admin);
 *   <li>{@code ONCEBUS_CLOCKED_CONNECTION_STRING} and {@code ONCEBUS_CLOCK_FILE}: a server whose time is read
 *       from that file (the shared dedup scenarios set it to each step's offset);
 *   <li>{@code ONCEBUS_SCENARIO_FILE}: tests/data/scenarios.json;
 *   <li>{@code ONCEBUS_TLS_PORT}: the real-clock server's TLS port.
 * </ul>
 */
final class Env {
    final String connectionString;
    volatile String clockedConnectionString;
    final Path clockFile;
    final Path scenarioFile;
    final String tlsPort;

    private Env(String connectionString, String clockedConnectionString, Path clockFile, Path scenarioFile,
        String tlsPort) {
        this.connectionString = connectionString;
        this.clockedConnectionString = clockedConnectionString;
        this.clockFile = clockFile;
        this.scenarioFile = scenarioFile;
        this.tlsPort = tlsPort;
    }

    static Env fromEnvironment() {
        return new Env(
            required("ONCEBUS_CONNECTION_STRING"),
            System.getenv("ONCEBUS_CLOCKED_CONNECTION_STRING"),
            pathOrNull(System.getenv("ONCEBUS_CLOCK_FILE")),
            pathOrNull(System.getenv("ONCEBUS_SCENARIO_FILE")),
            System.getenv("ONCEBUS_TLS_PORT"));
    }

    private static String required(String name) {
        String value = System.getenv(name);
        if (value == null || value.isBlank()) {
            throw new IllegalStateException(name + " is not set");
        }
        return value;
    }

    private static Path pathOrNull(String value) {
        return value == null || value.isBlank() ? null : Path.of(value);
    }

    /** A client builder for {@code connectionString}, failing fast: the SDK's retries would only slow a refusal. */
    static ServiceBusClientBuilder client(String connectionString) {
        return new ServiceBusClientBuilder()
            .connectionString(connectionString)
            .retryOptions(new AmqpRetryOptions().setMaxRetries(1).setDelay(Duration.ofMillis(200))
                .setTryTimeout(Duration.ofSeconds(20)));
    }

    ServiceBusClientBuilder client() {
        return client(connectionString);
    }

    /** The port of the connection string's endpoint ({@code sb://127.0.0.1:PORT}). */
    static int port(String connectionString) {
        for (String part : connectionString.split(";")) {
            if (part.regionMatches(true, 0, "Endpoint=", 0, 9)) {
                return URI.create(part.substring(9).trim()).getPort();
            }
        }
        throw new IllegalArgumentException("no Endpoint in the connection string");
    }

    /**
     * The administration client as a Java user reaches oncebus: the connection string, plus a policy that puts the
     * endpoint's port back in each request's URL. The Java builder keeps only the endpoint's host
     * ({@code https://127.0.0.1/...}, port 443); TLS is trusted through {@code -Djavax.net.ssl.trustStore}.
     */
    static ServiceBusAdministrationClient admin(String connectionString) {
        int port = port(connectionString);
        HttpPipelinePolicy keepPort = (context, next) -> {
            UrlBuilder url = UrlBuilder.parse(context.getHttpRequest().getUrl());
            context.getHttpRequest().setUrl(url.setPort(port).toString());
            return next.process();
        };
        return new ServiceBusAdministrationClientBuilder().connectionString(connectionString).addPolicy(keepPort)
            .buildClient();
    }

    ServiceBusAdministrationClient admin() {
        return admin(connectionString);
    }
}
